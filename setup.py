"""Builds the optional C extensions (binlog rows to Avro: cdcserver/store/_transcode.pyx;
Avro blocks to JSON lines: cdcserver/protocol/_jsonlines.pyx; a dump's result rows to its row
form: cdcserver/dump/_rawrows.pyx; on Spark executors, Avro blocks to Arrow buffers:
client/spark/_avroarrow.pyx, which imports as mariadb_cdc_client.spark._avroarrow, the
package-dir mapping of pyproject.toml); everything else is in pyproject.toml. Without a C
compiler the build goes on without them and the service and the Spark source take their
pure-Python paths."""

from Cython.Build import cythonize
from setuptools import Extension, setup

extensions = cythonize(
    [Extension("cdcserver.store._transcode", ["cdcserver/store/_transcode.pyx"],
               optional=True),
     Extension("cdcserver.protocol._jsonlines", ["cdcserver/protocol/_jsonlines.pyx"],
               optional=True),
     Extension("cdcserver.dump._rawrows", ["cdcserver/dump/_rawrows.pyx"], optional=True),
     Extension("mariadb_cdc_client.spark._avroarrow", ["client/spark/_avroarrow.pyx"],
               optional=True)],
    compiler_directives={"language_level": "3"},
)
for extension in extensions:
    extension.optional = True  # cythonize copies the Extension; keep it optional

setup(ext_modules=extensions)
