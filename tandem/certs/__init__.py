"""Certificates and keys of a deployment: the CA, service identities, the KV signing key."""
