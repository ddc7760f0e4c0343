"""`python -m soarpack.commands`: print the README's reference section of the commands' options."""

from soarpack.commands import reference


def main() -> int:
    print(reference(), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
