"""Builds the optional C extension (cdcserver/store/_transcode.pyx); everything else is in
pyproject.toml. Without a C compiler the build goes on without it and the service takes its
pure-Python path (cdcserver/store/transcoder.py)."""

from Cython.Build import cythonize
from setuptools import Extension, setup

extensions = cythonize(
    [Extension("cdcserver.store._transcode", ["cdcserver/store/_transcode.pyx"],
               optional=True)],
    compiler_directives={"language_level": "3"},
)
for extension in extensions:
    extension.optional = True  # cythonize copies the Extension; keep it optional

setup(ext_modules=extensions)
