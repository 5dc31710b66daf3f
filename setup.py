"""Packaging beyond pyproject.toml: the top-level conf/ ships inside the wheel as attnlab/conf.

pyproject.toml cannot combine package discovery with a package mapped from outside src/, so the
package list and its data (all of it: a [tool.setuptools.package-data] table would replace
this one) live here; ``attnlab.config.compose.find_conf_dir`` finds the configs in either place.
"""
from setuptools import find_packages, setup

setup(
    packages=[*find_packages("src"), "attnlab.conf"],
    package_dir={"": "src", "attnlab.conf": "conf"},
    package_data={
        "attnlab.conf": ["**/*.yaml"],
        "attnlab.writing": ["templates/*.j2"],
    },
)
