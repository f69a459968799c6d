//! The OpenAPI document of the JSON API, written from the descriptors: a
//! path per unary call, a schema per message in the proto3 JSON mapping,
//! and the Connect error every call may answer with. The document is
//! checked in (`docs/openapi.json`) and served; the test here keeps the
//! two the same (`HOURGLASS_BLESS=1` rewrites it).

use prost_reflect::{DescriptorPool, FieldDescriptor, Kind, MessageDescriptor};
use serde_json::{Map, Value, json};
use tonic::Code;

use super::connect::{code_name, http_status};

/// The codes a call can answer with, besides OK, and why each happens.
const ERRORS: &[(Code, &str)] = &[
    (Code::InvalidArgument, "The request is not valid: `details` names each field at fault."),
    (Code::Unauthenticated, "No token, or one the server does not know."),
    (Code::PermissionDenied, "The token's tenant may not use this topic or call."),
    (Code::NotFound, "No such message, series or call."),
    (Code::AlreadyExists, "The id is taken by a message with other content."),
    (Code::ResourceExhausted, "A bound is reached (the tenant's, the backlog's, the server's): retry later."),
    (Code::Unimplemented, "The media type, encoding or call is not served over HTTP/JSON."),
    (Code::Internal, "The server failed the call."),
    (Code::Unavailable, "The server is stopping or cannot reach its store or Kafka: retry with the same id."),
    (Code::DeadlineExceeded, "The call took longer than `Connect-Timeout-Ms`."),
];

pub(super) fn document(pool: &DescriptorPool) -> Value {
    let mut paths = Map::new();
    let mut schemas = Map::new();
    let mut services: Vec<_> = pool.services().filter(|s| s.package_name() == "hourglass.v1").collect();
    services.sort_by(|a, b| a.full_name().cmp(b.full_name()));
    for service in services {
        for method in service.methods() {
            if method.is_client_streaming() || method.is_server_streaming() {
                continue;
            }
            add_schema(&method.input(), &mut schemas);
            add_schema(&method.output(), &mut schemas);
            let mut responses = Map::new();
            responses.insert(
                "200".into(),
                json!({
                    "description": "The call's answer.",
                    "content": {"application/json": {"schema": reference(&method.output())}},
                }),
            );
            for (code, _) in ERRORS {
                let status = http_status(*code).as_u16().to_string();
                responses.entry(status).or_insert_with(|| json!({"$ref": "#/components/responses/Error"}));
            }
            for extra in ["408", "413", "415"] {
                responses.insert(extra.into(), json!({"$ref": "#/components/responses/Error"}));
            }
            paths.insert(
                format!("/{}/{}", service.full_name(), method.name()),
                json!({"post": {
                    "operationId": format!("{}.{}", service.name(), method.name()),
                    "tags": [service.name()],
                    "requestBody": {
                        "required": true,
                        "content": {"application/json": {"schema": reference(&method.input())}},
                    },
                    "responses": responses,
                }}),
            );
        }
    }
    let codes: Vec<_> = ERRORS.iter().map(|(code, _)| code_name(*code)).collect();
    let why: String = ERRORS
        .iter()
        .map(|(code, why)| format!("- `{}` ({}): {why}\n", code_name(*code), http_status(*code)))
        .collect();
    schemas.insert(
        "Error".into(),
        json!({
            "type": "object",
            "description": format!("A refused call, as the Connect protocol writes it.\n\n{why}"),
            "required": ["code"],
            "properties": {
                "code": {"type": "string", "enum": codes},
                "message": {"type": "string"},
                "details": {"type": "array", "items": {
                    "type": "object",
                    "required": ["type", "value"],
                    "properties": {
                        "type": {"type": "string", "description": "The detail's message type, e.g. google.rpc.BadRequest."},
                        "value": {"type": "string", "format": "byte"},
                        "debug": {"type": "object", "description": "The detail as JSON."},
                    },
                }},
            },
        }),
    );
    json!({
        "openapi": "3.0.3",
        "info": {
            "title": "hourglass",
            "version": "v1",
            "description": "Delayed delivery for Apache Kafka, as JSON over HTTP: every unary call of the gRPC \
                API, `POST /<service>/<method>` with the request message as JSON (the proto3 JSON mapping) and \
                the answer as JSON, as the Connect protocol defines it. It is served on the gRPC port, with \
                the same tokens and TLS. Streaming calls are served over gRPC and gRPC-Web only.",
        },
        "security": [{"token": []}],
        "paths": paths,
        "components": {
            "securitySchemes": {"token": {
                "type": "http",
                "scheme": "bearer",
                "description": "A token from the server's tokens file (--auth-tokens), when it has one.",
            }},
            "responses": {"Error": {
                "description": "The call was refused: see the Error schema for each code.",
                "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
            }},
            "schemas": schemas,
        },
    })
}

fn reference(message: &MessageDescriptor) -> Value {
    match well_known(message) {
        Some(schema) => schema,
        None => json!({"$ref": format!("#/components/schemas/{}", message.full_name())}),
    }
}

/// The proto3 JSON form of the well-known types used.
fn well_known(message: &MessageDescriptor) -> Option<Value> {
    match message.full_name() {
        "google.protobuf.Timestamp" => Some(json!({"type": "string", "format": "date-time"})),
        "google.protobuf.Duration" => {
            Some(json!({"type": "string", "pattern": "^-?[0-9]{1,12}(\\.[0-9]{1,9})?s$"}))
        }
        "google.protobuf.Empty" => Some(json!({"type": "object"})),
        _ => None,
    }
}

fn add_schema(message: &MessageDescriptor, schemas: &mut Map<String, Value>) {
    if well_known(message).is_some() || schemas.contains_key(message.full_name()) {
        return;
    }
    schemas.insert(message.full_name().to_owned(), Value::Null);
    let mut properties = Map::new();
    for field in message.fields() {
        properties.insert(field.json_name().to_owned(), field_schema(&field, schemas));
    }
    schemas.insert(
        message.full_name().to_owned(),
        json!({"type": "object", "properties": properties, "additionalProperties": false}),
    );
}

fn field_schema(field: &FieldDescriptor, schemas: &mut Map<String, Value>) -> Value {
    if field.is_map() {
        let Kind::Message(entry) = field.kind() else { unreachable!("a map's kind is its entry") };
        let value = entry.map_entry_value_field();
        return json!({"type": "object", "additionalProperties": kind_schema(&value.kind(), schemas)});
    }
    let one = kind_schema(&field.kind(), schemas);
    if field.is_list() { json!({"type": "array", "items": one}) } else { one }
}

fn kind_schema(kind: &Kind, schemas: &mut Map<String, Value>) -> Value {
    match kind {
        Kind::Double | Kind::Float => json!({"type": "number"}),
        Kind::Int32 | Kind::Sint32 | Kind::Sfixed32 => json!({"type": "integer", "format": "int32"}),
        Kind::Uint32 | Kind::Fixed32 => json!({"type": "integer", "minimum": 0, "maximum": u32::MAX}),
        // 64-bit integers are written as strings, and read as either.
        Kind::Int64 | Kind::Sint64 | Kind::Sfixed64 => json!({"anyOf": [
            {"type": "integer", "format": "int64"},
            {"type": "string", "pattern": "^-?[0-9]{1,18}$"},
        ]}),
        Kind::Uint64 | Kind::Fixed64 => json!({"anyOf": [
            {"type": "integer", "minimum": 0},
            {"type": "string", "pattern": "^[0-9]{1,19}$"},
        ]}),
        Kind::Bool => json!({"type": "boolean"}),
        Kind::String => json!({"type": "string"}),
        Kind::Bytes => json!({"type": "string", "format": "byte"}),
        Kind::Enum(e) => {
            json!({"type": "string", "enum": e.values().map(|v| v.name().to_owned()).collect::<Vec<_>>()})
        }
        Kind::Message(message) => {
            add_schema(message, schemas);
            reference(message)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_checked_in_document_is_the_one_the_descriptors_make() {
        let made = serde_json::to_string_pretty(&document(&super::super::descriptors())).unwrap() + "\n";
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/openapi.json");
        if std::env::var_os("HOURGLASS_BLESS").is_some() {
            std::fs::write(path, &made).unwrap();
        }
        assert!(
            super::super::OPENAPI == made,
            "docs/openapi.json is not the document the proto makes: run HOURGLASS_BLESS=1 cargo test --lib web::"
        );
    }

    #[test]
    fn every_unary_call_has_a_path_and_streams_have_none() {
        let document = document(&super::super::descriptors());
        let paths = document["paths"].as_object().unwrap();
        assert!(paths.contains_key("/hourglass.v1.Scheduler/Schedule"));
        assert!(paths.contains_key("/hourglass.v1.Admin/SetRateLimit"));
        assert!(!paths.contains_key("/hourglass.v1.Scheduler/ScheduleStream"));
        let schedule = &document["components"]["schemas"]["hourglass.v1.ScheduleRequest"]["properties"];
        assert_eq!(schedule["deliverAt"]["format"], "date-time");
    }
}
