"""The placement chain's plugins, one small module each; ``stack.py`` beside them assembles them."""
