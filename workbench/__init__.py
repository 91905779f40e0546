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

from .analysis.cost_model import HARDWARE as HARDWARE
from .analysis.cost_model import Hardware as Hardware
from .analysis.cost_model import collective_time as collective_time
from .analysis.cost_model import group_spans_hosts as group_spans_hosts
from .analysis.cost_model import hardware as hardware
from .analysis.gpu_target import GPU_CHIPS as GPU_CHIPS
from .analysis.gpu_target import gpu_targets_for as gpu_targets_for
from .analysis.ledger import CommLedger as CommLedger
from .analysis.ledger import ledger_for_mode as ledger_for_mode
from .analysis.ledger import ledger_table as ledger_table
from .analysis.ledger import theoretical_collectives as theoretical_collectives
from .analysis.model_layout import ModelLayout as ModelLayout
from .analysis.model_layout import default_data as default_data
from .analysis.model_layout import model_layout as model_layout
from .analysis.model_layout import standard_rules as standard_rules
from .analysis.planning import TrainingPlan as TrainingPlan
from .analysis.planning import parse_byte_size as parse_byte_size
from .analysis.planning import plan_training as plan_training
from .analysis.reference_check import CheckReport as CheckReport
from .analysis.reference_check import reference_check as reference_check
from .analysis.reference_check import run_check as run_check
from .analysis.step_ledger import ledger_for_config as ledger_for_config
from .analysis.profile_report import ProfileReport as ProfileReport
from .analysis.profile_report import read_profile as read_profile
from .analysis.timeline import Timeline as Timeline
from .analysis.timeline import TraceFormatError as TraceFormatError
from .analysis.timeline import read_timeline as read_timeline
from .analysis.memory_comparison import MemoryComparison as MemoryComparison
from .analysis.compiled_step import CompiledStep as CompiledStep
from .analysis.compile_target import topologies_for as topologies_for
from .analysis.plan_comparison import PLAN_ACCURACY_FROM_BYTES as PLAN_ACCURACY_FROM_BYTES
from .analysis.plan_comparison import PlanComparison as PlanComparison
from .analysis.verification import VerificationJob as VerificationJob
from .analysis.verification import VerifySettings as VerifySettings
from .analysis.verification import check_verifiable as check_verifiable
from .analysis.verification import start_plan_verification as start_plan_verification
from .analysis.verification import start_verification as start_verification
from .analysis.verification import verify_plan as verify_plan
from .analysis.verification import verify_step as verify_step
from .analysis.verdict import TrainingVerdict as TrainingVerdict
from .analysis.verdict import training_verdict as training_verdict
from .views.colors import OKABE_ITO as OKABE_ITO
from .views.colors import device_color as device_color
from .views.colors import text_color_for as text_color_for
from .compile_cache import clear_compilation_cache as clear_compilation_cache
from .compile_cache import compilation_cache_info as compilation_cache_info
from .training.data_parallel import create_data_parallel_sharding as create_data_parallel_sharding
from .training.data_parallel import mean_of_gradient_trees as mean_of_gradient_trees
from .training.data_parallel import reduce_gradients as reduce_gradients
from .training.data_parallel import replicate_params as replicate_params
from .training.data_parallel import shard_batch as shard_batch
from .training.data_parallel import shard_model_state as shard_model_state
from .training.data_parallel import varying_axes as varying_axes
from .training.data import DATASETS as DATASETS
from .training.data import Dataset as Dataset
from .training.data import dataset_options as dataset_options
from .training.data import load_dataset as load_dataset
from .training.data import parse_data_options as parse_data_options
from .training.data import sharded_batches as sharded_batches
from .devices import DeviceCountWarning as DeviceCountWarning
from .devices import describe_devices as describe_devices
from .devices import device_setup as device_setup
from .devices import local_devices_text as local_devices_text
from .errors import DTypeError as DTypeError
from .errors import GradientSyncError as GradientSyncError
from .errors import MeshError as MeshError
from .errors import RuleError as RuleError
from .errors import RunError as RunError
from .errors import ShapeError as ShapeError
from .errors import SpecError as SpecError
from .errors import VerificationError as VerificationError
from .errors import WorkbenchError as WorkbenchError
from .formatting import align_columns as align_columns
from .formatting import format_bandwidth as format_bandwidth
from .formatting import format_bytes as format_bytes
from .formatting import format_seconds as format_seconds
from .layout.array_layout import ArrayLayout as ArrayLayout
from .layout.array_layout import DeviceSlice as DeviceSlice
from .layout.array_layout import layout_array as layout_array
from .layout.lint import lint_layout as lint_layout
from .layout.lint import lint_text as lint_text
from .layout.mesh import MeshShape as MeshShape
from .layout.mesh import abstract_mesh as abstract_mesh
from .layout.mesh import build_mesh as build_mesh
from .layout.mesh import parse_mesh as parse_mesh
from .training.models import MODELS as MODELS
from .training.models import ModelConfig as ModelConfig
from .training.models import abstract_model as abstract_model
from .training.models import build_model as build_model
from .training.models import has_tensor_parallel_layers as has_tensor_parallel_layers
from .training.models import loss_fn as loss_fn
from .training.models import model_class as model_class
from .training.models import model_config as model_config
from .training.models import param_count as param_count
from .training.models import parse_model_options as parse_model_options
from .training.models import tensor_parallel_rules as tensor_parallel_rules
from .training.models import model_config_for_data as model_config_for_data
from .training.modes import FAULTS as FAULTS
from .training.modes import mode_class as mode_class
from .training.modes import MeshFit as MeshFit
from .training.modes import MeshFix as MeshFix
from .training.modes import mesh_fit as mesh_fit
from .training.modes import DATA_PARALLEL_MODES as DATA_PARALLEL_MODES
from .training.modes import MODES as MODES
from .training.modes import StepPlan as StepPlan
from .training.modes import TrainState as TrainState
from .training.modes import build_mode as build_mode
from .training.modes import describe_modes as describe_modes
from .layout.paths import leaves_with_paths as leaves_with_paths
from .layout.paths import path_to_str as path_to_str
from .layout.rules import RuleTable as RuleTable
from .training.checkpoints import CheckpointError as CheckpointError
from .training.checkpoints import checkpoint_steps as checkpoint_steps
from .training.checkpoints import latest_checkpoint as latest_checkpoint
from .training.layout_change import LayoutChange as LayoutChange
from .training.layout_change import checkpoint_layout_change as checkpoint_layout_change
from .training.layout_change import layout_change_text as layout_change_text
from .training.runs import Run as Run
from .training.run_follower import RunFollower as RunFollower
from .training.process_group import ProcessGroup as ProcessGroup
from .analysis.process_check import check_across_processes as check_across_processes
from .training.process_share import ProcessShare as ProcessShare
from .training.run_follower import follow_run as follow_run
from .training.runs import RunWriter as RunWriter
from .training.run_reports import compare_runs as compare_runs
from .training.run_reports import compare_table as compare_table
from .training.runs import list_runs as list_runs
from .training.runs import load_run as load_run
from .layout.shapes import parse_dtype as parse_dtype
from .layout.shapes import parse_shape as parse_shape
from .layout.specs import format_spec as format_spec
from .layout.specs import parse_spec as parse_spec
from .layout.specs import spec_from_json as spec_from_json
from .layout.specs import spec_to_json as spec_to_json
from .layout.specs import validate_spec as validate_spec
from .training.config import OPTIMIZERS as OPTIMIZERS
from .training.config import TrainConfig as TrainConfig
from .training.config import make_optimizer as make_optimizer
from .training.step import AbstractStep as AbstractStep
from .training.step import BuiltStep as BuiltStep
from .training.step import build_abstract_step as build_abstract_step
from .training.step import CustomModel as CustomModel
from .training.step import build_step as build_step
from .training.sync_diagnostics import SyncReport as SyncReport
from .training.sync_diagnostics import noise_scale as noise_scale
from .training.sync_diagnostics import sync_report as sync_report
from .training.trainer import NonFiniteError as NonFiniteError
from .training.events import TrainEvent as TrainEvent
from .training.trainer import Trainer as Trainer
from .training.trainer import TrainerBusyError as TrainerBusyError
from .training.profiling import ProfileCapture as ProfileCapture
from .training.profiling import ProfileError as ProfileError
from .layout.tree_layout import LeafLayout as LeafLayout
from .layout.tree_layout import TreeLayout as TreeLayout
from .layout.tree_layout import layout_tree as layout_tree
from .layout.tree_layout import shard_largest_dim as shard_largest_dim
from .views.jax_picture import JaxPicture as JaxPicture
from .views.jax_picture import capture_visualize_sharding as capture_visualize_sharding
from .formatting import format_bytes_exact as format_bytes_exact
from .formatting import format_shape as format_shape
from .views.text import describe_array as describe_array
from .views.text import format_coords as format_coords
from .views.text import format_index as format_index
from .views.text import layout_table as layout_table
from .views.text import tiling_picture as tiling_picture
from .views.text import tree_table as tree_table
from .views.profile_text import memory_table as memory_table
from .views.profile_text import missing_figures as missing_figures
from .views.profile_text import profile_text as profile_text
from .views.profile_text import timeline_table as timeline_table

__version__ = "0.1.0"

# Drawn with plotly, imported on first use: `import workbench` stays light and free of plotly.
_LAZY = {"layout_figure": ".views.figures", "memory_bar_figure": ".views.figures",
         "comparison_figure": ".views.comparison_figure", "timeline_figure": ".views.profile_figures",
         "memory_figure": ".views.profile_figures"}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module 'workbench' has no attribute {name!r}")
