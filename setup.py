"""The one compiled piece of the project (the rest is declared in pyproject.toml).

``spark_analysis._recordwalk`` is the pcap record walk of the Spark decode in C (see
``spark_analysis/_recordwalk.c``).  It is optional: without a C compiler the install still
succeeds and the decode uses the same walk in Python, about a tenth slower end to end.
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("spark_analysis._recordwalk", ["spark_analysis/_recordwalk.c"],
                             optional=True)])
