"""Deployment files for a chosen setup: a Compose file per node, Kubernetes manifests or a Slurm batch script."""
