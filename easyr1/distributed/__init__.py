"""Process-level primitives the layers above share: Ulysses sequence parallelism's collectives
(``ulysses``), a free port for a rendezvous (``ports``), and tying a child's life to its parent's
(``lifetime``). Nothing here imports the rest of the engine."""
