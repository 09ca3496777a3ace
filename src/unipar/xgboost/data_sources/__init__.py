"""XGBoost-Ray's ``data_sources`` names. unipar reads every kind of data through
:mod:`unipar.xgboost.sources`; these classes answer XGBoost-Ray's questions about one kind
(is it this kind? how are its partitions given to actors?)."""

from unipar.xgboost.data_sources.dask import Dask
from unipar.xgboost.data_sources.data_source import RayFileType
from unipar.xgboost.data_sources.modin import Modin
from unipar.xgboost.data_sources.object_store import ObjectStore
from unipar.xgboost.data_sources.partitioned import Partitioned
from unipar.xgboost.data_sources.ray_dataset import RayDataset

__all__ = ["Dask", "Modin", "ObjectStore", "Partitioned", "RayDataset", "RayFileType"]
