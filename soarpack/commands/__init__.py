"""The typed request of each command (soarpack.request derives the command line, the API and their help from it).
Outside the command's own package, so that loading a request never binds a subpackage (soarpack.bench) over an API
function of the same name."""
