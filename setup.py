"""The compiled pieces of the project (the rest is declared in pyproject.toml).

Two hot loops of the Spark decode are written in C, each next to the Python version it
replaces (which stays, and which the tests hold it to):

* ``spark_analysis._recordwalk``: the pcap record walk (``spark_analysis/_recordwalk.c``);
* ``spark_analysis._netheaders``: the link, IPv4 and UDP/TCP header decode
  (``spark_analysis/_netheaders.c``).

Both are optional: without a C compiler the install still succeeds and the decode runs the
Python versions, slower (see the README).
"""

from setuptools import Extension, setup

setup(ext_modules=[
    Extension("spark_analysis._recordwalk", ["spark_analysis/_recordwalk.c"], optional=True),
    Extension("spark_analysis._netheaders", ["spark_analysis/_netheaders.c"], optional=True),
])
