"""The SGLang side: serving profiles, their lint, and our patch set for the OpenBMB minicpm_sala fork.

profiles.py  load_profile / list_profiles: server args + patches + the quantization recipe they serve
lint.py      lint_args: flags the fork knows, contradictions that cost a platform run
patches.py   patch_dir / list_patches / check_tree / apply_patches (stdlib only: runs on the platform image)
unidiff.py   unified diffs read and applied without `patch` or `git`
serverargs.py the fork's flags, parsed from its server_args.py or the recorded table
"""
