"""Vertical setting (same rows, different columns): Federated Forest, with plain or encrypted labels."""
