"""The placer's plugins, one small module each; ``services/placer/stack.py`` assembles them."""
