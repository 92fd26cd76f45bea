#!/bin/sh
# The minimum ACLs of txnguard's own principal (docs/deployment/security.md), as kafka-acls.sh commands.
# Usage: deploy/least-privilege-acls.sh [principal] [transactional-id prefix] [topic prefix]   (prints; pipe to sh)
# Add --bootstrap-server and --command-config for your admin client to each line (KRaft with StandardAuthorizer and
# ZooKeeper mode with AclAuthorizer alike), or on ZooKeeper mode --authorizer-properties zookeeper.connect=<zk>.
# No right on a group: the log's follower assigns itself its partitions, it joins no consumer group.
P=${1:-User:txnguard}; TXN=${2:-*}; TOPIC=${3:-*}
acl() { echo "kafka-acls.sh --add --allow-principal $P $*"; }
pattern() { [ "$1" = "*" ] && echo "" || echo "--resource-pattern-type prefixed"; }
acl --operation Describe --transactional-id "'$TXN'" $(pattern "$TXN")      # FindCoordinator, DescribeTransactions
acl --operation Describe --topic "'$TOPIC'" $(pattern "$TOPIC")             # Metadata; partitions in DescribeTransactions
acl --operation Describe --topic __consumer_offsets                         # offsets sent in transactions
acl --operation Read --topic "'$TOPIC'" $(pattern "$TOPIC")                 # optional: the leader's evidence (DescribeProducers)
acl --operation Describe --topic __transaction_state                        # the coordinator's log (verification.transaction_log)
acl --operation Read --topic __transaction_state                            # (its records: every transactional id's state)
# Only with verification.coordinator_evidence: verify_only:
# acl --operation ClusterAction --cluster
