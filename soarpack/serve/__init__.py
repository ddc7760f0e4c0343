"""The SGLang side: the lint of serving profiles' args (the profiles themselves: soarpack.recipe.profile), the fork
check, and our patch set for the OpenBMB minicpm_sala fork.

lint.py      lint_args: flags the fork knows, contradictions that cost a platform run
patches.py   patch_dir / list_patches / check_tree / apply_patches (stdlib only: runs on the platform image)
unidiff.py   unified diffs read and applied without `patch` or `git`
serverargs.py the fork's flags, parsed from its server_args.py or the recorded table
forkcheck.py `serve-check`: a checkpoint loaded through the fork's own code on a CPU (_fork_child.py, the child)
server.py    `rehearse-server`: the platform's launch line on a GPU box, eval, bench and score
"""
