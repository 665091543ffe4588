"""The contract's file options: other languages' generators accept the .proto as it is.

Read from the generated descriptor, which `make proto-check` keeps equal to the .proto, so an
option removed from the file fails here, not in an orchestrator's build.
"""

from __future__ import annotations

from workflow_engine.v1 import workflow_engine_pb2 as pb

GO_IMPORT_PATH = "github.com/workflow-engine/workflow-engine/gen/go/workflow_engine/v1"


def test_the_contract_keeps_its_names() -> None:
    assert pb.DESCRIPTOR.package == "workflow_engine.v1"
    assert pb.DESCRIPTOR.name == "workflow_engine/v1/workflow_engine.proto"
    assert pb.DESCRIPTOR.services_by_name["WorkflowEngine"].full_name == (
        "workflow_engine.v1.WorkflowEngine"
    )


def test_go_package_is_a_full_import_path_with_a_package_name() -> None:
    # protoc-gen-go refuses a file without go_package (or an M flag for it on every command).
    options = pb.DESCRIPTOR.GetOptions()
    assert options.HasField("go_package")
    assert options.go_package == f"{GO_IMPORT_PATH};workflowenginev1"


def test_other_languages_get_the_conventional_package_options() -> None:
    options = pb.DESCRIPTOR.GetOptions()
    assert options.java_package == "com.workflow_engine.v1"
    assert options.java_multiple_files is True
    assert options.java_outer_classname == "WorkflowEngineProto"
    assert options.csharp_namespace == "WorkflowEngine.V1"
    assert options.php_namespace == "WorkflowEngine\\V1"
    assert options.ruby_package == "WorkflowEngine::V1"
    assert options.objc_class_prefix == "WXX"
