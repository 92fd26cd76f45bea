"""J1-lite (issue 10, deliverable 4): Jepsen's Kafka queue workload, smaller, in Python.

    history.py   the recorded history (invoke/ok/fail/info operations, JSONL)
    checker.py   a pure checker over a history: aborted reads, lost writes, duplicates, inconsistent
                 offsets, torn transactions, non-monotonic polls
    workload.py  transactional writers and read_committed readers (confluent-kafka) that record it
    nemesis.py   the fault rotation: FaultRelay faults, broker SIGSTOP/SIGKILL, proxy SIGKILL
    run.py       one run: a 3-node Kafka behind one relay per broker, clients direct and through a
                 gateway proxy at the same time, the same faults for both, then a final read and the check
"""
