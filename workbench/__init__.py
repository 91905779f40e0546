"""Sharding Workbench: see and check how JAX arrays are laid out on device meshes.

Importing this package before JAX starts gives JAX 8 simulated CPU devices (``WORKBENCH_CPU_DEVICES``
overrides), so every mesh in the tutorials works on a laptop. It also switches on JAX's persistent
compilation cache in a per-user folder (``WORKBENCH_COMPILATION_CACHE`` moves it or, set to ``off``,
switches it off; see :mod:`workbench.compile_cache`), so a new kernel reaches its first step sooner.
The engine never imports a UI toolkit.

The API has two tiers: this package holds the names a user reaches for first (``__all__``); each layer,
``wb.layout``, ``wb.training``, ``wb.analysis`` and ``wb.views``, holds its own (its ``__all__``), and the
helper modules ``wb.devices``, ``wb.formatting`` and ``wb.compile_cache`` theirs.

Example:
    >>> import workbench as wb
    >>> wb.layout_array((8, 16), "data=4,model=2", "data, model").shard_shape
    (2, 8)
    >>> wb.layout.format_spec(wb.parse_spec("data, None"))
    'data, None'
"""

from .compile_cache import configure_compilation_cache as _configure_compilation_cache
from .devices import configure_cpu_devices as _configure_cpu_devices

_configure_cpu_devices()  # must run before anything below starts the JAX backend
_configure_compilation_cache()  # before the first compile, so a second process finds this one's programs

import importlib
import importlib.metadata
import warnings

# The top tier: what a user reaches for first (the README's and notebooks' names). Everything else is one level
# down, in the layer that owns it: wb.layout, wb.training, wb.analysis, wb.views (each with its __all__), and the
# helper modules wb.devices, wb.formatting, wb.compile_cache.

# Errors a user catches: every one is a WorkbenchError (a ValueError) whose message names a fix.
from .errors import DTypeError as DTypeError
from .errors import GradientSyncError as GradientSyncError
from .errors import MeshError as MeshError
from .errors import RuleError as RuleError
from .errors import RunError as RunError
from .errors import ShapeError as ShapeError
from .errors import SpecError as SpecError
from .errors import VerificationError as VerificationError
from .errors import WorkbenchError as WorkbenchError

# Devices, meshes, specs and the layouts they give.
from .devices import describe_devices as describe_devices
from .layout import MeshShape as MeshShape
from .layout import build_mesh as build_mesh
from .layout import layout_array as layout_array
from .layout import layout_tree as layout_tree
from .layout import lint_layout as lint_layout
from .layout import parse_mesh as parse_mesh
from .layout import parse_spec as parse_spec
from .layout import shard_largest_dim as shard_largest_dim

# Views of a layout or a profile, as text and JAX's own picture (the plotly figures are below).
from .formatting import format_bytes as format_bytes
from .views import capture_visualize_sharding as capture_visualize_sharding
from .views import layout_table as layout_table
from .views import tiling_picture as tiling_picture
from .views import tree_table as tree_table
from .views import _FIGURES  # the plotly figures and their modules, imported on first use (see __getattr__)
from .views.profile_text import profile_text as profile_text
from .renamed import RENAMED

# Data parallelism by hand, as the workshop writes it.
from .training import create_data_parallel_sharding as create_data_parallel_sharding
from .training import load_dataset as load_dataset
from .training import reduce_gradients as reduce_gradients
from .training import replicate_params as replicate_params
from .training import shard_batch as shard_batch

# Training: a config, whether its mode fits the mesh, the step, the trainer; runs on disk and their checkpoints.
from .training import TrainConfig as TrainConfig
from .training import Trainer as Trainer
from .training import build_step as build_step
from .training import checkpoint_layout_change as checkpoint_layout_change
from .training import checkpoint_steps as checkpoint_steps
from .training import compare_runs as compare_runs
from .training import compare_table as compare_table
from .training import follow_run as follow_run
from .training import latest_checkpoint as latest_checkpoint
from .training import layout_change_text as layout_change_text
from .training import list_runs as list_runs
from .training import load_run as load_run
from .training import mesh_fit as mesh_fit

# Analysis: a model's layout, the verdict, the communication ledger, the reference check, plans, profiles.
from .analysis import VerifySettings as VerifySettings
from .analysis import ledger_for_config as ledger_for_config
from .analysis import ledger_for_mode as ledger_for_mode
from .analysis import plan_training as plan_training
from .analysis import read_profile as read_profile
from .analysis import recommend as recommend
from .analysis import assert_layout as assert_layout
from .analysis import assert_step_budget as assert_step_budget
from .analysis import run_check as run_check
from .analysis import start_plan_verification as start_plan_verification
from .analysis import training_verdict as training_verdict
from .analysis.model_layout import model_layout as model_layout
from .analysis.reference_check import reference_check as reference_check

# The package's version, read from its metadata: pyproject.toml is the one place it is written.
try:
    __version__ = importlib.metadata.version("sharding-workbench")
except importlib.metadata.PackageNotFoundError:  # a source tree on the path that was never installed
    __version__ = "0+unknown"

__all__ = [
    # errors
    "WorkbenchError", "DTypeError", "GradientSyncError", "MeshError", "RuleError", "RunError", "ShapeError",
    "SpecError", "VerificationError",
    # devices, meshes, specs, layouts
    "describe_devices", "MeshShape", "build_mesh", "parse_mesh", "parse_spec",
    "layout_array", "layout_tree", "lint_layout", "shard_largest_dim",
    # views
    "capture_visualize_sharding", "format_bytes", "layout_table", "profile_text", "tiling_picture", "tree_table",
    # plotly figures, imported on first use
    "comparison_figure", "layout_figure", "memory_bar_figure", "memory_figure", "timeline_figure",
    # data parallelism by hand
    "create_data_parallel_sharding", "load_dataset", "reduce_gradients", "replicate_params", "shard_batch",
    # training, runs and checkpoints
    "TrainConfig", "Trainer", "build_step", "mesh_fit",
    "compare_runs", "compare_table", "follow_run", "list_runs", "load_run",
    "checkpoint_layout_change", "checkpoint_steps", "latest_checkpoint", "layout_change_text",
    # analysis
    "model_layout", "training_verdict", "ledger_for_config", "ledger_for_mode", "reference_check", "run_check",
    "plan_training", "VerifySettings", "start_plan_verification", "read_profile", "recommend",
    "assert_layout", "assert_step_budget",
]


# Names that were on the top tier before the two tiers (2026-11) and now live only in a layer: a user's script
# that reads ``wb.StepSetup`` keeps working, told once where the name lives now. Checked by tests/test_public_api.py.
_MOVED_TO_A_LAYER = {
    "training": (
        "AbstractStep BuiltStep CheckpointError CustomModel DATASETS DATA_PARALLEL_MODES Dataset FAULTS LayoutChange "
        "MODELS MODES MeshFit MeshFix ModelConfig NonFiniteError OPTIMIZERS ProcessGroup ProcessShare ProfileCapture "
        "ProfileError Run RunFollower RunWriter StepSetup SyncReport TrainEvent TrainState TrainerBusyError "
        "abstract_model build_abstract_step build_mode build_model dataset_options describe_modes "
        "has_tensor_parallel_layers loss_fn make_optimizer mean_of_gradient_trees mode_class model_class model_config "
        "model_config_for_data noise_scale param_count parse_data_options parse_model_options shard_model_state "
        "sharded_batches sync_report tensor_parallel_rules varying_axes"),
    "analysis": (
        "CheckReport CommLedger CompiledStep GPU_CHIPS HARDWARE Hardware MemoryComparison ModelLayout "
        "PLAN_ACCURACY_FROM_BYTES PlanComparison ProfileReport Timeline TraceFormatError TrainingPlan TrainingVerdict "
        "VerificationJob check_across_processes validate_verifiable collective_time default_data gpu_targets_for "
        "group_spans_hosts hardware ledger_table parse_byte_size read_timeline standard_rules start_verification "
        "theoretical_collectives topologies_for verify_plan verify_step"),
    "layout": (
        "ArrayLayout DeviceSlice LeafLayout RuleTable TreeLayout abstract_mesh format_spec leaves_with_paths lint_text "
        "parse_dtype parse_shape path_to_str spec_from_json spec_to_json validate_spec"),
    "views": (
        "JaxPicture OKABE_ITO describe_array device_color format_coords format_index memory_table missing_figures "
        "text_color_for timeline_table"),
    "formatting": "align_columns format_bandwidth format_bytes_exact format_seconds format_shape",
    "devices": "DeviceCountWarning device_setup local_devices_text",
    "compile_cache": "clear_compilation_cache compilation_cache_info",
}
_MOVED = {name: layer for layer, names in _MOVED_TO_A_LAYER.items() for name in names.split()}


def __getattr__(name: str):
    """A plotly figure (``wb.layout_figure``, ...), its module imported on first use: `import workbench` stays
    light and free of plotly (PEP 562); a name that moved to a layer, from there, with a DeprecationWarning."""
    if name in _FIGURES:
        return getattr(importlib.import_module(f".views.{_FIGURES[name]}", __name__), name)
    if name in _MOVED:
        layer = _MOVED[name]
        warnings.warn(f"workbench.{name} moved to workbench.{layer}.{name}: import it from there",
                      DeprecationWarning, stacklevel=2)
        return getattr(importlib.import_module(f".{layer}", __name__), name)
    if name in RENAMED:  # renamed after it left the top tier: say both
        new = RENAMED[name]
        warnings.warn(f"workbench.{name} was renamed {new}: use workbench.{_MOVED[new]}.{new}", DeprecationWarning,
                      stacklevel=2)
        return getattr(importlib.import_module(f".{_MOVED[new]}", __name__), new)
    raise AttributeError(f"module 'workbench' has no attribute {name!r}")
