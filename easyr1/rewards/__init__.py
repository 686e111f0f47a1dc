"""Rewards: built-ins (``math``, ``r1v``, ``dapo``) and EasyR1-style reward files behind one loader
(``loader``), run in a worker process (``worker``), and the reward's config (``config``).

Nothing is imported here, so reading the config imports no reward code.
"""
