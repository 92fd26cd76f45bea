"""KIP-890 part 1 outside the broker, as a pure state machine.

Owns: the transaction registry (transactional id -> producer id, epoch,
partitions, groups, state, generation), the verification decisions, coordinator
queries expressed as commands for the shell to carry out, and the audit record.

May import: the standard library, kio, ``txnguard.codecs`` and ``txnguard.policies``.
May not: do IO or read the clock; time arrives inside the events it is given.
"""
