"""Test doubles that run as real servers (not shipped in the package)."""
