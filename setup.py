"""Builds the optional C extensions (binlog rows to Avro: cdcserver/store/_transcode.pyx;
Avro blocks to JSON lines: cdcserver/protocol/_jsonlines.pyx; a dump's result rows to its row
form: cdcserver/dump/_rawrows.pyx; a databus message's rows: cdcserver/messages/_databus.pyx;
the binlog's DECIMAL values: cdcserver/replication/_bindecimal.pyx; its row images
to Python values: cdcserver/replication/_rowdecode.pyx; Kafka's partitioner hash of a message
key: cdcserver/sinks/kafka/_murmur2.pyx;
on Spark executors, Avro blocks to Arrow buffers:
client/spark/_avroarrow.pyx, which imports as mariadb_cdc_client.spark._avroarrow, the
package-dir mapping of pyproject.toml; in the client library, a stream's Avro blocks and JSON
lines to typed records: client/format/_records.pyx, a dump's lines to typed rows:
client/format/_dumprows.pyx); everything else is in pyproject.toml.
Without a C compiler the build goes on without them and the service and the Spark source take their
pure-Python paths."""

import os
import tempfile

from Cython.Build import cythonize
from setuptools import Extension, setup

HERE = os.path.dirname(os.path.abspath(__file__))


def include_path() -> str:
    """A folder where ``client/`` is ``mariadb_cdc_client``, the name the package imports as
    (pyproject.toml's package-dir), so that ``cimport mariadb_cdc_client.format._cavro``
    finds ``client/format/_cavro.pxd`` in a source tree and in an unpacked sdist alike."""
    folder = tempfile.mkdtemp(prefix="cdc-cython-")
    os.symlink(os.path.join(HERE, "client"), os.path.join(folder, "mariadb_cdc_client"))
    return folder


extensions = cythonize(
    [Extension("cdcserver.store._transcode", ["cdcserver/store/_transcode.pyx"],
               optional=True),
     Extension("cdcserver.protocol._jsonlines", ["cdcserver/protocol/_jsonlines.pyx"],
               optional=True),
     Extension("cdcserver.dump._rawrows", ["cdcserver/dump/_rawrows.pyx"], optional=True),
     Extension("cdcserver.messages._databus", ["cdcserver/messages/_databus.pyx"],
               optional=True),
     Extension("cdcserver.replication._bindecimal", ["cdcserver/replication/_bindecimal.pyx"],
               optional=True),
     Extension("cdcserver.sinks.kafka._murmur2", ["cdcserver/sinks/kafka/_murmur2.pyx"],
               optional=True),
     Extension("cdcserver.replication._rowdecode", ["cdcserver/replication/_rowdecode.pyx"],
               optional=True),
     Extension("mariadb_cdc_client.spark._avroarrow", ["client/spark/_avroarrow.pyx"],
               optional=True),
     Extension("mariadb_cdc_client.format._records", ["client/format/_records.pyx"],
               optional=True),
     Extension("mariadb_cdc_client.format._dumprows", ["client/format/_dumprows.pyx"],
               optional=True)],
    compiler_directives={"language_level": "3"},
    include_path=[include_path()],
)
for extension in extensions:
    extension.optional = True  # cythonize copies the Extension; keep it optional

setup(ext_modules=extensions)
