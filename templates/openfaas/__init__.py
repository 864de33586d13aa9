"""OpenFaaS function templates (``faas-cli new --lang flatpack``): ``flatpack/``."""
