"""Deployers: put a planned bundle's functions on a target and serve the endpoint in front of them."""

from serving.deploy.state import DeploymentRecord, state_dir

__all__ = ["DeploymentRecord", "state_dir"]
