"""Analysis of a training step: the communication ledger, planning and its cost model, the reference check.

Every public name of the layer, re-exported from the module that owns it (``wb.analysis.PlanComparison``); the
ones a user reaches for first are also on ``workbench`` itself (``wb.plan_training``). ``model_layout`` and
``reference_check`` are named like their modules: they are reached as ``wb.model_layout`` and
``wb.reference_check``, since re-exporting them here would hide their modules.
"""

from ..renamed import renamed_attribute
from .compile_target import INSTALL_LIBTPU as INSTALL_LIBTPU
from .compile_target import libtpu_installed as libtpu_installed
from .compile_target import topologies_for as topologies_for
from .compiled_step import CompiledStep as CompiledStep
from .cost_model import HARDWARE as HARDWARE
from .cost_model import Hardware as Hardware
from .cost_model import collective_time as collective_time
from .cost_model import group_spans_hosts as group_spans_hosts
from .cost_model import hardware as hardware
from .exported_step import ExportError as ExportError
from .exported_step import OwnModel as OwnModel
from .exported_step import OwnModelError as OwnModelError
from .gpu_target import GPU_CHIPS as GPU_CHIPS
from .gpu_target import gpu_compiler_problem as gpu_compiler_problem
from .gpu_target import gpu_targets_for as gpu_targets_for
from .layout_budget import assert_layout as assert_layout
from .layout_budget import assert_step_budget as assert_step_budget
from .layout_budget import layout_specs as layout_specs
from .layout_export import budget_test_code as budget_test_code
from .layout_export import layout_code as layout_code
from .ledger import CommLedger as CommLedger
from .ledger import ledger_for_mode as ledger_for_mode
from .ledger import ledger_table as ledger_table
from .ledger import theoretical_collectives as theoretical_collectives
from .memory_comparison import MemoryComparison as MemoryComparison
from .model_layout import ModelLayout as ModelLayout
from .model_layout import default_data as default_data
from .model_layout import standard_rules as standard_rules
from .plan_comparison import PLAN_ACCURACY_FROM_BYTES as PLAN_ACCURACY_FROM_BYTES
from .plan_comparison import PlanComparison as PlanComparison
from .planning import TrainingPlan as TrainingPlan
from .planning import parse_byte_size as parse_byte_size
from .planning import plan_training as plan_training
from .process_check import ProcessCheckReport as ProcessCheckReport
from .recommender import RecommendationError as RecommendationError
from .recommender import recommend as recommend
from .recommendation import Candidate as Candidate
from .recommendation import FamilyVerdict as FamilyVerdict
from .recommendation import TABLE_FIGURES as TABLE_FIGURES
from .recommendation import Recommendation as Recommendation
from .recommendation import layout_settings as layout_settings
from .layout_search import LayoutChoice as LayoutChoice
from .step_time import StepTime as StepTime
from .process_check import check_across_processes as check_across_processes
from .profile_report import ProfileReport as ProfileReport
from .profile_report import read_profile as read_profile
from .reference_check import CheckReport as CheckReport
from .reference_check import run_check as run_check
from .step_ledger import ledger_for_config as ledger_for_config
from .timeline import Timeline as Timeline
from .timeline import TraceFormatError as TraceFormatError
from .timeline import read_timeline as read_timeline
from .verdict import TrainingVerdict as TrainingVerdict
from .verdict import training_verdict as training_verdict
from .verification import VerificationJob as VerificationJob
from .verification import VerifySettings as VerifySettings
from .verification import validate_verifiable as validate_verifiable
from .verification import start_plan_verification as start_plan_verification
from .verification import start_verification as start_verification
from .verification import verify_plan as verify_plan
from .verification import verify_step as verify_step

__all__ = [
    # a model's layout and whether a mode trains on a mesh
    "ModelLayout", "default_data", "standard_rules",
    "TrainingVerdict", "training_verdict",
    # the communication ledger
    "CommLedger", "ledger_for_config", "ledger_for_mode", "ledger_table", "theoretical_collectives",
    # planning for production, its cost model and compile targets
    "TrainingPlan", "parse_byte_size", "plan_training",
    "HARDWARE", "Hardware", "collective_time", "group_spans_hosts", "hardware",
    "GPU_CHIPS", "gpu_compiler_problem", "gpu_targets_for",
    "INSTALL_LIBTPU", "libtpu_installed", "topologies_for",
    # which layout: the recommendation, its records and step-time model
    "Candidate", "FamilyVerdict", "LayoutChoice", "Recommendation", "RecommendationError", "StepTime", "TABLE_FIGURES",
    "layout_settings", "recommend",
    # a layout exported as code and as a budget test, and the assertions that test makes
    "assert_layout", "assert_step_budget", "budget_test_code", "layout_code", "layout_specs",
    # checking a plan with the compiler
    "VerificationJob", "VerifySettings", "validate_verifiable", "start_plan_verification", "start_verification",
    "verify_plan", "verify_step",
    "ExportError", "OwnModel", "OwnModelError",
    "CompiledStep", "MemoryComparison", "PLAN_ACCURACY_FROM_BYTES", "PlanComparison",
    # the reference check against one device
    "CheckReport", "ProcessCheckReport", "run_check", "check_across_processes",
    # profiles
    "ProfileReport", "read_profile", "Timeline", "TraceFormatError", "read_timeline",
]


def __getattr__(name: str):
    """An old name (see ``workbench.renamed``): its new value, with a DeprecationWarning."""
    return renamed_attribute(__name__, name, globals())
