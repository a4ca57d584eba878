"""The demo, as a composition root: it wires the libraries (``events``, ``coordinator``,
``spark_tasks``) into ``cutline demo``'s story, and no library imports it
(``tests/unit/test_layers.py``). ``python -m cutline_demo`` runs it; :mod:`cutline_demo.demo` holds it."""
