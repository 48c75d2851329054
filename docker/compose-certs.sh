#!/bin/sh
# compose's one-shot `certs` service: on the first start, a CA, one certificate per role (role-wide for the scalable
# prefill and decode services, so every replica `--scale` starts holds one), the KV signing key and the KV hash
# secret, all made by `tandem certs init` in the CA volume; then, on every start, each role's own files copied into
# that role's volume, which only that service mounts. The CA's key never leaves the CA volume. Runs as the images' tandem user.
#   PKI_ROOT (default /pki): ca/ holds the CA; gateway/ router/ planner/ prefill/ decode/ are the role volumes.
set -eu
root=${PKI_ROOT:-/pki}
ca=$root/ca
umask 077
if [ ! -s "$ca/ca.crt" ]; then
  # NOTE: init refuses a directory that already holds a CA; a volume with one is kept (delete it to start over)
  tandem certs init "$ca/new" --routers 1 --prefill 0 --decode 1 --role-wide prefill --role-wide decode
  for entry in "$ca"/new/*; do mv "$entry" "$ca/"; done
  rmdir "$ca/new"
fi
copy_identity() {  # ROLE IDENTITY-DIR: tls.crt, tls.key, ca.crt into the role's volume, 0600
  mkdir -p "$root/$1"
  for name in tls.crt tls.key ca.crt; do
    cp "$ca/$2/$name" "$root/$1/$name.tmp" && mv "$root/$1/$name.tmp" "$root/$1/$name"
  done
}
copy_identity gateway gateway
copy_identity router router
copy_identity planner planner
copy_identity prefill prefill-any
copy_identity decode decode-any
for role in prefill decode; do  # the KV handles' signing key: the workers only
  cp "$ca/kv-signing.key" "$root/$role/kv-signing.key.tmp" && mv "$root/$role/kv-signing.key.tmp" "$root/$role/kv-signing.key"
done
if [ ! -s "$ca/kv-hash.secret" ]; then  # NOTE: a CA volume made before the secret existed gets one now
  python -c "import secrets; print(secrets.token_hex(32))" > "$ca/kv-hash.secret.tmp" && mv "$ca/kv-hash.secret.tmp" "$ca/kv-hash.secret"
fi
if [ ! -s "$ca/redis.password" ]; then  # the Responses store's requirepass (compose's redis profile)
  python -c "import secrets; print(secrets.token_hex(24))" > "$ca/redis.password.tmp" && mv "$ca/redis.password.tmp" "$ca/redis.password"
fi
mkdir -p "$root/redis"
cp "$ca/redis.password" "$root/gateway/redis.password.tmp" && mv "$root/gateway/redis.password.tmp" "$root/gateway/redis.password"
cp "$ca/redis.password" "$root/redis/redis.password.tmp" && mv "$root/redis/redis.password.tmp" "$root/redis/redis.password"
for role in gateway router prefill decode; do  # the block hashes' secret: whoever hashes tokens or tenants
  cp "$ca/kv-hash.secret" "$root/$role/kv-hash.secret.tmp" && mv "$root/$role/kv-hash.secret.tmp" "$root/$role/kv-hash.secret"
done
chmod 0600 "$root"/*/* 2>/dev/null || true
# NOTE: the redis image runs as its own `redis` user, not tandem's: its password is readable in the one volume only
# the redis service mounts
chmod 0644 "$root/redis/redis.password"
echo "certs: CA $(sed -n 2p "$ca/ca.crt" | cut -c1-16)...; identities for gateway router planner prefill decode"
