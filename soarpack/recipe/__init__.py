"""The recipe and the serving profile as typed objects, read by one reader each.

    files        the packaged TOMLs and the one rule that tells a built-in name from a path
    keys         unknown keys and tables are errors that name the nearest known key
    calibration  the calibration settings a recipe may set, their defaults, and how flags override them
    plan         which grid each decoder linear gets: Marlin's grids, the `dynamic` regexes, the plan
    model        the Recipe (a pydantic model that is the recipe), read from TOML, rendered back
    profile      the serving Profile: server args, patches, fallback, the recipe it serves
    checkpoint   the quantization_config pair: a Recipe into a checkpoint's config.json and back out
"""
