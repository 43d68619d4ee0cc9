"""The health monitor: heartbeats and GPU health in, node and GPU health facts out. ``decide`` is
its pure policy (which GPU signals matter, and the node state machine), ``service`` its async
shell."""
