"""Frozen data and protocols: the bottom layer, importing nothing of raf but raf.errors."""
