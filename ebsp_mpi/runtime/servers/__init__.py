"""The servers' side: rank 0's recorder and evaluator, and rank 0's link to the other servers (its
orders to them). The servers' message loops sit beside this package, in ``runtime/``."""
