"""sandboxd's package installer's entry point: `/opt/py/bin/python /opt/sandboxd/sandboxd_install.py`.

The code lives in sandboxd_installer.py beside it (see there): an imported module
loads from the bytecode compiled when the rootfs was built, while a script is
compiled from source on every start.
"""
from sandboxd_installer import main

main()
