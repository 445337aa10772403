"""The Python worker daemon that Spark starts (``spark.python.daemon.module``).

This is PySpark's own daemon (:mod:`pyspark.daemon`, unchanged), with one difference: PySpark
and Py4J are imported from their installed, byte-compiled packages instead of from the zip
files Spark puts on the path.  :func:`spark_analysis.session.get_spark` selects it unless the
configuration already names a daemon module.

Why: Spark puts ``$SPARK_HOME/python/lib/pyspark.zip``, Py4J's source zip and the
``spark-core`` jar first on the path of every Python daemon and worker it starts.  The zips
hold only sources, and Python cannot cache compiled code inside a zip, so every daemon and
worker compiled each PySpark module it imported, again for each new SparkContext.  And each
worker read the directories of the zips and the jar (about 7,500 entries) once more on its
first task, when Spark adds its files directory to the path and invalidates the import caches.
Measured on the 2-core machine with PySpark 4.3: the daemon took 0.7 CPU-s to start instead
of 0.17, and each worker about 0.5 CPU-s more on its first task, all of it before a job's
first tasks can get going.

The entries are taken off the path only in the layout of a pip install, where the installed
packages hold the same files: the pyspark zip must be the one inside the installed ``pyspark``
package (``<site-packages>/pyspark/python/lib/pyspark.zip``), and nothing before that package
on the path may have a ``pyspark`` of its own.  The Py4J zip goes only when the installed Py4J
has the version its name gives, and the jars only when they are the package's own
(``<site-packages>/pyspark/jars/``, which hold no Python code).  Any other layout is left
exactly as Spark set it, for example a Spark distribution's ``SPARK_HOME``.  The entries are
dropped rather than moved to the end: a zip left on the path is still opened by imports that
search the whole path, and its directory read again on every cache invalidation.

Nothing here may import pyspark before the path is settled.  The workers are forked from this
process and inherit its modules and path.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Sequence

_PY4J_ZIP = re.compile(r"py4j-(?P<version>[0-9.]+)-src\.zip")
_VERSION = re.compile(r"""__version__\s*=\s*["']([^"']+)["']""")


def _installed_version(package_dir: str) -> str | None:
    """``__version__`` as written in ``package_dir/version.py``, without importing it."""
    try:
        with open(os.path.join(package_dir, "version.py"), encoding="utf-8") as handle:
            found = _VERSION.search(handle.read())
    except OSError:
        return None
    return found.group(1) if found else None


def prefer_installed(path: Sequence[str]) -> list[str]:
    """``path`` without Spark's bundled pyspark and Py4J zips when the same packages are
    installed (byte-compiled) and found instead; else ``path`` unchanged (see the module
    docstring)."""
    entries = list(path)
    bundled = [e for e in entries if os.path.basename(e) == "pyspark.zip"]
    if len(bundled) != 1:
        return entries
    lib = os.path.dirname(bundled[0])
    package = os.path.dirname(os.path.dirname(lib))  # <site>/pyspark/python/lib -> <site>/pyspark
    site = os.path.dirname(package)
    if (os.path.basename(package) != "pyspark"
            or not os.path.isfile(os.path.join(package, "__init__.py"))
            or site not in entries):
        return entries
    before = entries[:entries.index(site)]
    if any(e != bundled[0] and os.path.exists(os.path.join(e or ".", "pyspark")) for e in before):
        return entries  # another pyspark would be found first
    dropped = [bundled[0]]
    jars = os.path.join(package, "jars")
    py4j = _installed_version(os.path.join(site, "py4j"))
    for entry in entries:
        named = _PY4J_ZIP.fullmatch(os.path.basename(entry))
        same_py4j = named is not None and os.path.dirname(entry) == lib and py4j == named["version"]
        own_jar = os.path.dirname(entry) == jars and entry.endswith(".jar")
        if same_py4j or own_jar:
            dropped.append(entry)
    return [e for e in entries if e not in dropped]


def main() -> None:
    kept = prefer_installed(sys.path)
    dropped = tuple(set(sys.path) - set(kept))
    # finding this module opened the zips already; a cached zip importer (also those of
    # packages inside it, "<zip>/<package>") would have its directory read again on every
    # importlib.invalidate_caches()
    for cached in [k for k in sys.path_importer_cache if k.startswith(dropped)]:
        del sys.path_importer_cache[cached]
    sys.path[:] = kept
    from pyspark.daemon import manager

    manager()


if __name__ == "__main__":
    main()
