"""The submission bundle: build the .tar.gz the SOAR platform runs, and rehearse it before an upload is spent.

    build.py     build_bundle(): tree + MANIFEST.json + deterministic tarball; refuses oversize and credentials
    check.py     check_bundle(): safe extraction, structure, lint, then a rehearsal of prepare_env/prepare_model
    wheels.py    the platform wheel set (CPython 3.10 manylinux x86_64) from platform-lock.json, with a cache
    tarpack.py   deterministic packing, safe extraction
    manifest.py  MANIFEST.json as a typed record (one reader; the bundle id) and the bundle.env rendered from it
    secrets.py   what counts as a credential
    layout.py    names inside a bundle
"""
