"""Training: configs, data sets, models, the parallel modes, the step builder, the trainer and its runs.

Every public name of the layer, re-exported from the module that owns it (``wb.training.RunFollower``); the ones a
user reaches for first are also on ``workbench`` itself (``wb.Trainer``).
"""

from ..renamed import renamed_attribute
from .checkpoints import CheckpointError as CheckpointError
from .checkpoints import checkpoint_steps as checkpoint_steps
from .checkpoints import latest_checkpoint as latest_checkpoint
from .config import OPTIMIZERS as OPTIMIZERS
from .config import ResolvedConfig as ResolvedConfig
from .config import TrainConfig as TrainConfig
from .config import make_optimizer as make_optimizer
from .config import resolve_config as resolve_config
from .data import DATASETS as DATASETS
from .data import Dataset as Dataset
from .data import dataset_options as dataset_options
from .data import load_dataset as load_dataset
from .data import parse_data_options as parse_data_options
from .data import sharded_batches as sharded_batches
from .data_parallel import create_data_parallel_sharding as create_data_parallel_sharding
from .data_parallel import mean_of_gradient_trees as mean_of_gradient_trees
from .data_parallel import reduce_gradients as reduce_gradients
from .data_parallel import replicate_params as replicate_params
from .data_parallel import shard_batch as shard_batch
from .data_parallel import shard_model_state as shard_model_state
from .data_parallel import varying_axes as varying_axes
from .events import TrainEvent as TrainEvent
from .layout_change import LayoutChange as LayoutChange
from .layout_change import checkpoint_layout_change as checkpoint_layout_change
from .layout_change import layout_change_text as layout_change_text
from .models import MODELS as MODELS
from .models import ModelConfig as ModelConfig
from .models import abstract_model as abstract_model
from .models import build_model as build_model
from .models import has_tensor_parallel_layers as has_tensor_parallel_layers
from .models import loss_fn as loss_fn
from .models import model_class as model_class
from .models import model_config as model_config
from .models import model_config_for_data as model_config_for_data
from .models import param_count as param_count
from .models import parse_model_options as parse_model_options
from .models import tensor_parallel_rules as tensor_parallel_rules
from .modes import DATA_PARALLEL_MODES as DATA_PARALLEL_MODES
from .modes import FAULTS as FAULTS
from .modes import MODES as MODES
from .modes import MeshFit as MeshFit
from .modes import MeshFix as MeshFix
from .modes import StepSetup as StepSetup
from .modes import TrainState as TrainState
from .modes import build_mode as build_mode
from .modes import describe_modes as describe_modes
from .modes import mesh_fit as mesh_fit
from .modes import mode_class as mode_class
from .process_group import ProcessGroup as ProcessGroup
from .process_share import ProcessShare as ProcessShare
from .profiling import ProfileCapture as ProfileCapture
from .profiling import ProfileError as ProfileError
from .profiling import ProfileRequest as ProfileRequest
from .run_follower import RunFollower as RunFollower
from .run_follower import follow_run as follow_run
from .remat import REMAT_MEANINGS as REMAT_MEANINGS
from .remat import REMAT_POLICIES as REMAT_POLICIES
from .remat import RematError as RematError
from .remat import validate_remat as validate_remat
from .runs import Run as Run
from .runs import RunWriter as RunWriter
from .run_reports import compare_runs as compare_runs
from .run_reports import compare_table as compare_table
from .runs import list_runs as list_runs
from .runs import load_run as load_run
from .step import AbstractStep as AbstractStep
from .step import BuiltStep as BuiltStep
from .step import CustomModel as CustomModel
from .step import build_abstract_step as build_abstract_step
from .step import build_step as build_step
from .sync_diagnostics import SyncReport as SyncReport
from .sync_diagnostics import noise_scale as noise_scale
from .sync_diagnostics import sync_report as sync_report
from .trainer import NonFiniteError as NonFiniteError
from .trainer import Trainer as Trainer
from .trainer import TrainerBusyError as TrainerBusyError

__all__ = [
    # a run: its config, the trainer, its events and errors
    "TrainConfig", "ResolvedConfig", "resolve_config", "OPTIMIZERS", "make_optimizer",
    "Trainer", "TrainEvent", "TrainerBusyError", "NonFiniteError",
    # data sets and models
    "DATASETS", "Dataset", "dataset_options", "load_dataset", "parse_data_options", "sharded_batches",
    "MODELS", "ModelConfig", "abstract_model", "build_model", "has_tensor_parallel_layers", "loss_fn",
    "model_class", "model_config", "model_config_for_data", "param_count", "parse_model_options",
    "tensor_parallel_rules",
    "REMAT_MEANINGS", "REMAT_POLICIES", "RematError", "validate_remat",
    # the parallel modes and the step they build
    "MODES", "DATA_PARALLEL_MODES", "FAULTS", "MeshFit", "MeshFix", "StepSetup", "TrainState",
    "build_mode", "describe_modes", "mesh_fit", "mode_class",
    "AbstractStep", "BuiltStep", "CustomModel", "build_abstract_step", "build_step",
    # data parallelism by hand (the workshop's pieces)
    "create_data_parallel_sharding", "mean_of_gradient_trees", "reduce_gradients", "replicate_params",
    "shard_batch", "shard_model_state", "varying_axes",
    "SyncReport", "noise_scale", "sync_report",
    # runs on disk, followed live, and their checkpoints
    "Run", "RunWriter", "compare_runs", "compare_table", "list_runs", "load_run",
    "RunFollower", "follow_run",
    "CheckpointError", "checkpoint_steps", "latest_checkpoint",
    "LayoutChange", "checkpoint_layout_change", "layout_change_text",
    # across processes, and profiles
    "ProcessGroup", "ProcessShare",
    "ProfileCapture", "ProfileError", "ProfileRequest",
]


def __getattr__(name: str):
    """An old name (see ``workbench.renamed``): its new value, with a DeprecationWarning."""
    return renamed_attribute(__name__, name, globals())
