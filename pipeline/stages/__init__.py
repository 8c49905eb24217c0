from .base import Resources, Stage
