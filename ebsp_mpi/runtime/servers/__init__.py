"""The servers' side: the message loops of rank 0 (``server``) and of ranks 1..k-1 (``shard_server``),
the orders they all carry out through one executor (``orders``, ``executor``, rank 0's part in
``host``), a server's shard (``shard``, its push receives, BSP's streamed rounds), and rank 0's
recorder, evaluator and link to the other servers (``peers``)."""
