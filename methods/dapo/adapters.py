"""DAPO's framework adapters (verl's policy losses, TRL's trainer), built from methods/common/zoo.yaml."""

from methods.common import zoo

zoo.register("dapo")
