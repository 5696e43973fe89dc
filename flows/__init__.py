"""Prefect flows, deployments and the `copc` CLI: the only layer importing prefect."""
