"""Outputs: never over an input, never half there, never a moment without one.

Every writer stages its output in a temporary sibling of the target and hands it to `write.placing` (the one
placement step), so an interrupted run (Ctrl-C, a full disk, SIGKILL) leaves the old target or the new one, and at
most a `.TARGET.tmp-*` that no reader mistakes for a result and that the next run removes once its lock is free.

    write      the writers' entry points: prepare_output_dir, placing, atomic_dir/atomic_file, atomic_write_*
    place      Staging (the temp beside the target) and place(): create, replace or "up to date"
    journal    several renames that must look like one (replace_files; a folder swap without RENAME_EXCHANGE)
    cleanup    after killed runs: finish their journals, remove their temps, say which
    locks      the flock()ed `.TARGET.tmp-ID.lock` files that tell a live owner from a dead one
    owner      what a lock file or a temp folder's marker records about its owner, and whether that process lives
    checks     what is refused before any work: an input as output, an unwritable folder, a full disk
    content    hashes and comparisons of outputs, removing a temp, published permissions
    rename     the renameat2(2) binding (RENAME_NOREPLACE, RENAME_EXCHANGE)

No function here prints: each that can say something takes a `log`, silent unless the caller passes one.
"""
