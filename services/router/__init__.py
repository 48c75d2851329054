"""The router: worker registry (leases, in-flight load) and routing decisions. Never on the token path."""
