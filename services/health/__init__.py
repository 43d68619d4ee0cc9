"""The health monitor: heartbeats and GPU health in, node and GPU health facts out. ``service`` is
its async shell; the policy it applies is ``services.agent.health`` (pure)."""
