"""Sharding Workbench: see and check how JAX arrays are laid out on device meshes.

Importing this package before JAX starts gives JAX 8 simulated CPU devices (``WORKBENCH_CPU_DEVICES``
overrides), so every mesh in the tutorials works on a laptop. It also switches on JAX's persistent
compilation cache in a per-user folder (``WORKBENCH_COMPILATION_CACHE`` moves it or, set to ``off``,
switches it off; see :mod:`workbench.compile_cache`), so a new kernel reaches its first step sooner.
The engine never imports a UI toolkit.

Example:
    >>> import workbench as wb
    >>> wb.layout_array((8, 16), "data=4,model=2", "data, model").shard_shape
    (2, 8)
"""

from .compile_cache import configure_compilation_cache as _configure_compilation_cache
from .devices import configure_cpu_devices as _configure_cpu_devices

_configure_cpu_devices()  # must run before anything below starts the JAX backend
_configure_compilation_cache()  # before the first compile, so a second process finds this one's programs

from .colors import device_color as device_color
from .compile_cache import clear_compilation_cache as clear_compilation_cache
from .compile_cache import compilation_cache_info as compilation_cache_info
from .data_parallel import create_data_parallel_sharding as create_data_parallel_sharding
from .data_parallel import mean_of_gradient_trees as mean_of_gradient_trees
from .data_parallel import reduce_gradients as reduce_gradients
from .data_parallel import replicate_params as replicate_params
from .data_parallel import shard_batch as shard_batch
from .data_parallel import shard_model_state as shard_model_state
from .data_parallel import varying_axes as varying_axes
from .data import DATASETS as DATASETS
from .data import Dataset as Dataset
from .data import dataset_options as dataset_options
from .data import load_dataset as load_dataset
from .data import parse_data_options as parse_data_options
from .data import sharded_batches as sharded_batches
from .devices import DeviceCountWarning as DeviceCountWarning
from .devices import describe_devices as describe_devices
from .devices import device_setup as device_setup
from .errors import DTypeError as DTypeError
from .errors import GradientSyncError as GradientSyncError
from .errors import MeshError as MeshError
from .errors import RuleError as RuleError
from .errors import RunError as RunError
from .errors import ShapeError as ShapeError
from .errors import SpecError as SpecError
from .errors import WorkbenchError as WorkbenchError
from .layout import ArrayLayout as ArrayLayout
from .layout import DeviceSlice as DeviceSlice
from .layout import layout_array as layout_array
from .mesh import MeshShape as MeshShape
from .mesh import abstract_mesh as abstract_mesh
from .mesh import build_mesh as build_mesh
from .mesh import parse_mesh as parse_mesh
from .models import MODELS as MODELS
from .models import ModelConfig as ModelConfig
from .models import abstract_model as abstract_model
from .models import build_model as build_model
from .models import has_tensor_parallel_layers as has_tensor_parallel_layers
from .models import loss_fn as loss_fn
from .models import model_config as model_config
from .models import param_count as param_count
from .models import parse_model_options as parse_model_options
from .models import tensor_parallel_rules as tensor_parallel_rules
from .models import model_config_for_data as model_config_for_data
from .modes import MODES as MODES
from .modes import StepPlan as StepPlan
from .modes import TrainState as TrainState
from .modes import build_mode as build_mode
from .modes import describe_modes as describe_modes
from .paths import leaves_with_paths as leaves_with_paths
from .paths import path_to_str as path_to_str
from .rules import RuleTable as RuleTable
from .runs import Run as Run
from .runs import RunWriter as RunWriter
from .runs import compare_runs as compare_runs
from .runs import compare_table as compare_table
from .runs import list_runs as list_runs
from .runs import load_run as load_run
from .shapes import parse_dtype as parse_dtype
from .shapes import parse_shape as parse_shape
from .specs import format_spec as format_spec
from .specs import parse_spec as parse_spec
from .specs import spec_from_json as spec_from_json
from .specs import spec_to_json as spec_to_json
from .specs import validate_spec as validate_spec
from .train_config import OPTIMIZERS as OPTIMIZERS
from .train_config import TrainConfig as TrainConfig
from .train_config import make_optimizer as make_optimizer
from .trainer import NonFiniteError as NonFiniteError
from .trainer import TrainEvent as TrainEvent
from .trainer import Trainer as Trainer
from .trainer import TrainerBusyError as TrainerBusyError
from .tree_layout import LeafLayout as LeafLayout
from .tree_layout import TreeLayout as TreeLayout
from .tree_layout import layout_tree as layout_tree
from .tree_layout import shard_largest_dim as shard_largest_dim
from .view_jax import JaxPicture as JaxPicture
from .view_jax import capture_visualize_sharding as capture_visualize_sharding
from .view_text import format_bytes as format_bytes
from .view_text import layout_table as layout_table
from .view_text import tiling_picture as tiling_picture
from .view_text import tree_table as tree_table

__version__ = "0.1.0"
