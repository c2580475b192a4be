"""sandboxd's entry point for Python runs: `/opt/py/bin/python /opt/sandboxd/runner.py ...`.

The code lives in sandboxd_runner.py beside it: an imported module loads from the
bytecode compiled when the rootfs was built, while a script is compiled from source
on every start (a few milliseconds of each cold run).
"""
from sandboxd_runner import main

main()
