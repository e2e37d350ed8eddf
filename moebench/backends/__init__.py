"""Dispatch/combine backends; see base.py for the protocol and the registry."""
from .base import REGISTRY, Backend, Dispatched, Unavailable, get, names, parse_backends

__all__ = ["REGISTRY", "Backend", "Dispatched", "Unavailable", "get", "names", "parse_backends"]
