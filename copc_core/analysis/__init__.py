"""Exact analysis of the two-channel update on small enumerable problems (torch only)."""
