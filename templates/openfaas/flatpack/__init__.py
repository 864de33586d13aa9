"""The ``flatpack`` OpenFaaS template: of-watchdog (HTTP mode) in front of ``index.py``, a small HTTP
server over the function runtime. Kept as a package so its files ship with flatpack."""
