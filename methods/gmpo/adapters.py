"""GMPO's framework adapters (verl's policy losses), built from methods/common/zoo.yaml."""

from methods.common import zoo

zoo.register("gmpo")
