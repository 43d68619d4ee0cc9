"""The end-to-end benchmark, ``python -m bench.e2e``: every part of corral as its own process on
one machine, and a client submitting as fast as the system takes it. ``__main__`` runs it; the
other modules are the processes it starts (``agents``, ``client``) and what it
measures them with (``measure``)."""
