#!/usr/bin/env bash
# An example network across machines: three organizations, each on its own host with its own
# engine (PostgreSQL, MariaDB, PostgreSQL), ordering through the three-node Kafka cluster of
# deploy/kafka, agreeing when any two of them match (any-2), with Smallbank's tables shared.
#
#   deploy/examples/three-orgs.sh OUT [CHAINIFY]
#
# writes OUT/ with network.toml, tls/ (the CA and its key: keep ca.key offline), clients/ and
# org1/ org2/ org3/. Then, per organization N:
#   1. copy network.toml, tls/ca.pem and orgN/ to orgN.example.net:/etc/chainify/
#      (orgN/ holds the organization's signing key and TLS key: it goes to that machine only);
#   2. create the shared tables in its database (same schema everywhere);
#   3. systemctl enable --now chainify@orgN.target (deploy/systemd, docs/operations.md).
# Clients get network.toml, tls/ca.pem and their clients/<id>.pk8.
#
# The databases are reached over their Unix sockets with peer authentication, so no password
# sits in a configuration file; edit database_url in orgN/org.toml to use another way.
set -euo pipefail

out="${1:?usage: $0 OUT [CHAINIFY]}"
chainify="${2:-chainify}"

"$chainify" init --out "$out" --orgs 3 --clients 2 \
    --network-id example --policy any-2 \
    --hosts org1.example.net,org2.example.net,org3.example.net \
    --base-port 7100 \
    --orderer kafka --kafka-topic example-ledger --kafka-replication 3 \
    --kafka-brokers kafka1.example.net:9092,kafka2.example.net:9092,kafka3.example.net:9092 \
    --database 'postgres://chainify@localhost/chainify?host=/run/postgresql' \
    --database 'mysql://chainify@localhost/chainify?socket=/run/mysqld/mysqld.sock' \
    --database 'postgres://chainify@localhost/chainify?host=/run/postgresql' \
    --tables accounts,savings,checking \
    --block-txs 1024 --batch-timeout-ms 50 --checkpoint-interval 100
echo "wrote $out: copy network.toml, tls/ca.pem and orgN/ to orgN.example.net (see $0)"
