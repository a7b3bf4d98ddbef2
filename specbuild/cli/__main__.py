"""`python -m specbuild.cli`: the same app as the `specbuild` script."""

from specbuild.cli.app import main

main()
