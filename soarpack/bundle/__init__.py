"""The submission bundle: build the .tar.gz the SOAR platform runs (soarpack.rehearse.check rehearses it).

    build.py     build_bundle(): tree + MANIFEST.json + deterministic tarball; refuses oversize and credentials
    wheels.py    the platform wheel set (CPython 3.10 manylinux x86_64) from platform-lock.json, with a cache;
                 the wheel-tag check
    tarpack.py   deterministic packing, safe extraction
    manifest.py  MANIFEST.json as a typed record (one reader; the bundle id) and the bundle.env rendered from it
    secrets.py   what counts as a credential
    layout.py    names inside a bundle
"""
