"""Fake HybridEP extension module for the gate tests (see deep_ep/__init__.py beside it)."""
