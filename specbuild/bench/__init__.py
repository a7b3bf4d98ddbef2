"""bench: load a running deployment over Triton's streaming API (`client`, `load`), report the figures as a
table, JSON or PNG (`report`), and what `specbuild bench` does (`run`)."""
