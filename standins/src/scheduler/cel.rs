//! DRA device selectors as kube-scheduler evaluates them (k8s.io/dynamic-resource-allocation/cel,
//! `compile.go`): one variable, `device`, with `driver`, `attributes` and `capacity` (maps of
//! domain → name → value, a name without a domain being the driver's; looking up a domain no
//! attribute has gives an empty map, not an error, while a missing name in a domain is an
//! error), `allowMultipleAllocations`; Kubernetes' `semver` and `quantity` libraries
//! (k8s.io/apiserver/pkg/cel/library) and `cel.bind`. Parsing and evaluation are the `cel`
//! crate's; only the Kubernetes-specific parts are here.

use std::any::Any;
use std::cmp::Ordering;
use std::collections::HashMap;
use std::sync::Arc;

use cel::common::ast::{ComprehensionExpr, Expr, IdedExpr, ListExpr, LiteralValue};
use cel::common::traits::{Container, Indexer};
use cel::common::types::{self, CelBool, CelInt, CelMap, CelMapKey, CelString, Type};
use cel::common::value::{CowVal, StaticVal, Val};
use cel::parser::{Macro, MacroExprHelper};
use cel::{Context, Env, ExecutionError, ParseError, Program, Value};
use kube_quantity::ParsedQuantity;
use serde_json::Value as Json;

/// The longest selector expression the API server takes (`CELSelectorExpressionMaxLength`).
pub const MAX_EXPRESSION_BYTES: usize = 10 * 1024;

static SEMVER: Type = Type::new_unspecified_type("kubernetes.Semver");
static QUANTITY: Type = Type::new_unspecified_type("kubernetes.Quantity");

/// A version attribute, or `semver("1.2.3")`: SemVer 2.0, strictly (as blang/semver parses it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Semver(semver::Version);

/// A capacity, or `quantity("80Gi")`.
#[derive(Debug, Clone)]
pub struct Quantity(ParsedQuantity);

impl Val for Semver {
    fn get_type(&self) -> &Type {
        <Self as Val>::cel_type()
    }
    fn cel_type() -> &'static Type {
        &SEMVER
    }
    fn equals(&self, other: &dyn Val) -> bool {
        other.downcast_ref::<Semver>().is_some_and(|o| o.0.cmp_precedence(&self.0) == Ordering::Equal)
    }
    fn clone_as_boxed<'v>(&self) -> Box<dyn Val + 'v> {
        Box::new(self.clone())
    }
    fn as_any(&self) -> Option<&dyn Any> {
        Some(self)
    }
}
impl StaticVal for Semver {}

impl Val for Quantity {
    fn get_type(&self) -> &Type {
        <Self as Val>::cel_type()
    }
    fn cel_type() -> &'static Type {
        &QUANTITY
    }
    fn equals(&self, other: &dyn Val) -> bool {
        other.downcast_ref::<Quantity>().is_some_and(|o| o.0 == self.0)
    }
    fn clone_as_boxed<'v>(&self) -> Box<dyn Val + 'v> {
        Box::new(self.clone())
    }
    fn as_any(&self) -> Option<&dyn Any> {
        Some(self)
    }
}
impl StaticVal for Quantity {}

/// `device.attributes` and `device.capacity`: by domain, an empty map for a domain nothing has
/// (upstream's `newStringInterfaceMapWithDefault`), so `device.attributes["other.io"].x` is a
/// missing key in an empty map rather than a missing domain.
#[derive(Debug, Clone, Default)]
struct Domains(CelMap<'static>);

impl Val for Domains {
    fn get_type(&self) -> &Type {
        <Self as Val>::cel_type()
    }
    fn cel_type() -> &'static Type {
        &types::MAP_TYPE
    }
    fn equals(&self, other: &dyn Val) -> bool {
        other.downcast_ref::<Domains>().is_some_and(|o| self.0.equals(&o.0))
    }
    fn clone_as_boxed<'v>(&self) -> Box<dyn Val + 'v> {
        Box::new(self.clone())
    }
    fn as_any(&self) -> Option<&dyn Any> {
        Some(self)
    }
    fn as_indexer<'b, 'v>(&'b self) -> Option<&'b (dyn Indexer + 'v)>
    where
        Self: 'v,
    {
        Some(self)
    }
    fn as_container(&self) -> Option<&dyn Container> {
        Some(self)
    }
}
impl StaticVal for Domains {}

impl Indexer for Domains {
    fn get<'b, 'v>(&'b self, idx: &dyn Val) -> Result<CowVal<'b, 'v>, ExecutionError>
    where
        Self: 'v,
    {
        match self.0.get(idx) {
            Ok(v) => Ok(v),
            Err(ExecutionError::NoSuchKey(_)) => Ok(CowVal::owned(CelMap::default())),
            Err(e) => Err(e),
        }
    }
    fn steal<'v>(self: Box<Self>, idx: &dyn Val) -> Result<Box<dyn Val + 'v>, ExecutionError>
    where
        Self: 'v,
    {
        self.get(idx).map(CowVal::into_owned)
    }
}

impl Container for Domains {
    fn contains(&self, value: &dyn Val) -> Result<bool, ExecutionError> {
        self.0.contains(value)
    }
}

/// Why a selector could not be compiled or evaluated.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CelError {
    #[error("compilation failed: {0}")]
    Compile(String),
    /// Its worst-case cost is over [`super::cel_cost::MAX_COST`] (the API server's words).
    #[error("too complex, exceeds cost limit")]
    TooComplex,
    #[error("{0}")]
    Runtime(String),
}

/// The selector environment, built once.
pub struct Selectors {
    env: Arc<Env>,
}

/// A compiled selector.
pub struct Selector {
    program: Program,
    env: Arc<Env>,
    /// The domains the expression names literally (`device.attributes["D"]`, `capacity["D"]`),
    /// to name one a device has nothing in when a lookup in it fails.
    domains: Vec<String>,
}

/// The domains `expression` looks up literally in `attributes` or `capacity`.
fn named_domains(expression: &str) -> Vec<String> {
    static LOOKUP: std::sync::LazyLock<regex::Regex> = std::sync::LazyLock::new(|| {
        regex::Regex::new(r#"\b(?:attributes|capacity)\s*\[\s*(?:"([^"\\]*)"|'([^'\\]*)')\s*\]"#)
            .expect("a valid pattern")
    });
    let mut out: Vec<String> = LOOKUP
        .captures_iter(expression)
        .filter_map(|c| c.get(1).or_else(|| c.get(2)).map(|m| m.as_str().to_owned()))
        .collect();
    out.sort();
    out.dedup();
    out
}

impl Selectors {
    pub fn new() -> Self {
        let mut env = Env::stdlib();
        // Only a declaration conflict with the standard library could fail here: a bug, not input.
        library(&mut env).expect("the Kubernetes CEL libraries declare nothing the standard library has");
        Selectors { env: Arc::new(env) }
    }

    /// `expression` compiled, or why not (too long, or not CEL).
    pub fn compile(&self, expression: &str) -> Result<Selector, CelError> {
        if expression.len() > MAX_EXPRESSION_BYTES {
            return Err(CelError::Compile(format!("may not be more than {MAX_EXPRESSION_BYTES} bytes")));
        }
        let program = self.env.compile(expression).map_err(|e| CelError::Compile(e.to_string()))?;
        if super::cel_cost::estimate(program.expression()) > super::cel_cost::MAX_COST {
            return Err(CelError::TooComplex);
        }
        Ok(Selector { program, env: self.env.clone(), domains: named_domains(expression) })
    }

    /// The worst-case cost of `expression` (see [`super::cel_cost`]).
    pub fn estimate(&self, expression: &str) -> Result<f64, CelError> {
        let program = self.env.compile(expression).map_err(|e| CelError::Compile(e.to_string()))?;
        Ok(super::cel_cost::estimate(program.expression()))
    }
}

impl Default for Selectors {
    fn default() -> Self {
        Self::new()
    }
}

impl Selector {
    /// Whether `device` (of `driver`, as a ResourceSlice lists it) matches; a result that is
    /// not a bool, a missing attribute or an attribute that is not what its type says is an
    /// error, as in the scheduler.
    pub fn matches(&self, driver: &str, device: &Json) -> Result<bool, CelError> {
        let value = device_value(driver, device)?;
        let mut context = Context::with_env(self.env.clone());
        context.add_variable_as_val("device", Box::new(value));
        match self.program.execute(&context) {
            Ok(Value::Bool(b)) => Ok(b),
            Ok(other) => {
                Err(CelError::Runtime(format!("CEL result of type {} could not be converted to bool", other.type_of())))
            }
            Err(e) => Err(CelError::Runtime(self.unknown_domain(driver, device, &e.to_string()))),
        }
    }

    /// A missing key's error with, first, the domain the expression names that the device has
    /// no attribute or capacity in (a misspelt `nvidia.comm` fails as `No such key: gdr`, the
    /// name looked up in the empty map, which points at the wrong word).
    fn unknown_domain(&self, driver: &str, device: &Json, error: &str) -> String {
        if !error.to_ascii_lowercase().contains("no such key") {
            return error.to_owned();
        }
        let mut has: Vec<&str> = ["attributes", "capacity"]
            .iter()
            .flat_map(|k| device[*k].as_object().into_iter().flatten())
            .map(|(name, _)| qualified(name, driver).0)
            .collect();
        has.sort_unstable();
        has.dedup();
        let unknown: Vec<String> =
            self.domains.iter().filter(|d| !has.contains(&d.as_str())).map(|d| format!("{d:?}")).collect();
        if unknown.is_empty() {
            return error.to_owned();
        }
        let has: Vec<String> = has.iter().map(|d| format!("{d:?}")).collect();
        format!(
            "unknown domain {}: the device has no attribute or capacity in it (its domains: {}): {error}",
            unknown.join(", "),
            has.join(", ")
        )
    }
}

/// `(domain, name)` of an attribute or capacity name, the driver's domain when it has none.
fn qualified<'a>(name: &'a str, driver: &'a str) -> (&'a str, &'a str) {
    name.split_once('/').unwrap_or((driver, name))
}

/// The `device` variable for one device of a slice.
fn device_value(driver: &str, device: &Json) -> Result<CelMap<'static>, CelError> {
    let mut attributes: HashMap<String, HashMap<CelMapKey<'static>, Box<dyn Val>>> = HashMap::new();
    for (name, v) in device["attributes"].as_object().into_iter().flatten() {
        let value: Box<dyn Val> = if let Some(s) = v["string"].as_str() {
            Box::new(CelString::from(s.to_owned()))
        } else if let Some(i) = v["int"].as_i64() {
            Box::new(CelInt::from(i))
        } else if let Some(b) = v["bool"].as_bool() {
            Box::new(CelBool::from(b))
        } else if let Some(s) = v["version"].as_str() {
            let version = semver::Version::parse(s)
                .map_err(|e| CelError::Runtime(format!("attribute {name}: parse semantic version: {e}")))?;
            Box::new(Semver(version))
        } else {
            return Err(CelError::Runtime(format!("attribute {name}: unsupported attribute value")));
        };
        let (domain, id) = qualified(name, driver);
        attributes.entry(domain.to_owned()).or_default().insert(CelMapKey::from(id.to_owned()), value);
    }
    let mut capacity: HashMap<String, HashMap<CelMapKey<'static>, Box<dyn Val>>> = HashMap::new();
    for (name, v) in device["capacity"].as_object().into_iter().flatten() {
        let text = v["value"].as_str().unwrap_or_default();
        let q = ParsedQuantity::try_from(text)
            .map_err(|e| CelError::Runtime(format!("capacity {name}: quantity {text:?}: {e}")))?;
        let (domain, id) = qualified(name, driver);
        capacity.entry(domain.to_owned()).or_default().insert(CelMapKey::from(id.to_owned()), Box::new(Quantity(q)));
    }
    let domains = |m: HashMap<String, HashMap<CelMapKey<'static>, Box<dyn Val>>>| {
        let outer: HashMap<CelMapKey<'static>, Box<dyn Val>> =
            m.into_iter().map(|(k, v)| (CelMapKey::from(k), Box::new(CelMap::from(v)) as Box<dyn Val>)).collect();
        Domains(CelMap::from(outer))
    };
    let mut fields: HashMap<CelMapKey<'static>, Box<dyn Val>> = HashMap::new();
    fields.insert("driver".into(), Box::new(CelString::from(driver.to_owned())));
    fields.insert("attributes".into(), Box::new(domains(attributes)));
    fields.insert("capacity".into(), Box::new(domains(capacity)));
    fields.insert(
        "allowMultipleAllocations".into(),
        Box::new(CelBool::from(device["allowMultipleAllocations"].as_bool().unwrap_or(false))),
    );
    Ok(CelMap::from(fields))
}

// The libraries' functions: `Env` overloads take plain fns over their arguments.

fn arg<'a, T: Val + StaticVal>(args: &'a [CowVal<'_, '_>], i: usize, function: &str) -> Result<&'a T, ExecutionError> {
    args.get(i).and_then(|a| a.as_any()).and_then(|a| a.downcast_ref::<T>()).ok_or_else(|| {
        ExecutionError::function_error(function, format!("argument {i} is not a {}", T::cel_type().name()))
    })
}

fn string_arg<'a>(args: &'a [CowVal<'_, '_>], i: usize, function: &str) -> Result<&'a str, ExecutionError> {
    args.get(i)
        .and_then(|a| a.downcast_ref::<CelString>())
        .map(|s| s.inner())
        .ok_or_else(|| ExecutionError::function_error(function, format!("argument {i} is not a string")))
}

fn semver_of<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let s = string_arg(&args, 0, "semver")?;
    semver::Version::parse(s)
        .map(|v| CowVal::owned(Semver(v)))
        .map_err(|e| ExecutionError::function_error("semver", format!("could not parse {s:?} as semver: {e}")))
}

fn is_semver<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let s = string_arg(&args, 0, "isSemver")?;
    Ok(CowVal::owned(CelBool::from(semver::Version::parse(s).is_ok())))
}

fn quantity_of<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let s = string_arg(&args, 0, "quantity")?;
    ParsedQuantity::try_from(s)
        .map(|q| CowVal::owned(Quantity(q)))
        .map_err(|e| ExecutionError::function_error("quantity", format!("invalid quantity {s:?}: {e}")))
}

fn is_quantity<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let s = string_arg(&args, 0, "isQuantity")?;
    Ok(CowVal::owned(CelBool::from(ParsedQuantity::try_from(s).is_ok())))
}

/// Values the libraries compare: versions by SemVer precedence, quantities by value.
trait Ordered: Val + StaticVal {
    fn order(&self, other: &Self) -> Ordering;
}

impl Ordered for Semver {
    fn order(&self, other: &Self) -> Ordering {
        self.0.cmp_precedence(&other.0)
    }
}

impl Ordered for Quantity {
    fn order(&self, other: &Self) -> Ordering {
        self.0.cmp(&other.0)
    }
}

fn compared<T: Ordered>(args: &[CowVal<'_, '_>], f: &str) -> Result<Ordering, ExecutionError> {
    Ok(arg::<T>(args, 0, f)?.order(arg::<T>(args, 1, f)?))
}

/// `isGreaterThan`, `isLessThan` and `compareTo` of a library type, as overload fns.
macro_rules! comparisons {
    ($t:ty, $greater:ident, $less:ident, $compare:ident) => {
        fn $greater<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
            Ok(CowVal::owned(CelBool::from(compared::<$t>(&args, "isGreaterThan")? == Ordering::Greater)))
        }
        fn $less<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
            Ok(CowVal::owned(CelBool::from(compared::<$t>(&args, "isLessThan")? == Ordering::Less)))
        }
        fn $compare<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
            Ok(ordering(compared::<$t>(&args, "compareTo")?))
        }
    };
}

comparisons!(Semver, semver_greater, semver_less, semver_compare);
comparisons!(Quantity, quantity_greater, quantity_less, quantity_compare);

fn ordering<'b, 'v>(o: Ordering) -> CowVal<'b, 'v> {
    CowVal::owned(CelInt::from(o as i64))
}

/// `major()`, `minor()`, `patch()` of a version.
fn semver_part<'b, 'v>(
    args: &[CowVal<'b, 'v>],
    f: &str,
    part: fn(&semver::Version) -> u64,
) -> Result<CowVal<'b, 'v>, ExecutionError> {
    Ok(CowVal::owned(CelInt::from(part(&arg::<Semver>(args, 0, f)?.0) as i64)))
}
fn semver_major<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    semver_part(&args, "major", |v| v.major)
}
fn semver_minor<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    semver_part(&args, "minor", |v| v.minor)
}
fn semver_patch<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    semver_part(&args, "patch", |v| v.patch)
}
fn quantity_add<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let sum = arg::<Quantity>(&args, 0, "add")?.0.clone() + arg::<Quantity>(&args, 1, "add")?.0.clone();
    Ok(CowVal::owned(Quantity(sum)))
}
fn quantity_sub<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let diff = arg::<Quantity>(&args, 0, "sub")?.0.clone() - arg::<Quantity>(&args, 1, "sub")?.0.clone();
    Ok(CowVal::owned(Quantity(diff)))
}
fn quantity_sign<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let zero = ParsedQuantity::try_from("0").map_err(|e| ExecutionError::function_error("sign", e.to_string()))?;
    Ok(ordering(arg::<Quantity>(&args, 0, "sign")?.0.cmp(&zero)))
}
fn quantity_is_integer<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    Ok(CowVal::owned(CelBool::from(arg::<Quantity>(&args, 0, "isInteger")?.0.to_bytes_i64().is_some())))
}
fn quantity_as_integer<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let q = arg::<Quantity>(&args, 0, "asInteger")?;
    q.0.to_bytes_i64()
        .map(|i| CowVal::owned(CelInt::from(i)))
        .ok_or_else(|| ExecutionError::function_error("asInteger", format!("cannot convert value {} to integer", q.0)))
}

/// Kubernetes' semver and quantity libraries, and `cel.bind`, on `env`.
fn library(env: &mut Env) -> Result<(), cel::DeclarationError> {
    env.add_type(SEMVER.to_owned())?;
    env.add_type(QUANTITY.to_owned())?;
    let s = || types::STRING_TYPE;
    env.add_overload("semver", "string_to_semver", vec![s()], semver_of)?;
    env.add_overload("isSemver", "is_semver_string", vec![s()], is_semver)?;
    env.add_overload("quantity", "string_to_quantity", vec![s()], quantity_of)?;
    env.add_overload("isQuantity", "is_quantity_string", vec![s()], is_quantity)?;
    let (sv, q) = (|| SEMVER.to_owned(), || QUANTITY.to_owned());
    env.add_member_overload("isGreaterThan", "semver_is_greater_than", sv(), vec![sv()], semver_greater)?;
    env.add_member_overload("isLessThan", "semver_is_less_than", sv(), vec![sv()], semver_less)?;
    env.add_member_overload("compareTo", "semver_compare_to", sv(), vec![sv()], semver_compare)?;
    env.add_member_overload("major", "semver_major", sv(), vec![], semver_major)?;
    env.add_member_overload("minor", "semver_minor", sv(), vec![], semver_minor)?;
    env.add_member_overload("patch", "semver_patch", sv(), vec![], semver_patch)?;
    env.add_member_overload("isGreaterThan", "quantity_is_greater_than", q(), vec![q()], quantity_greater)?;
    env.add_member_overload("isLessThan", "quantity_is_less_than", q(), vec![q()], quantity_less)?;
    env.add_member_overload("compareTo", "quantity_compare_to", q(), vec![q()], quantity_compare)?;
    env.add_member_overload("add", "quantity_add", q(), vec![q()], quantity_add)?;
    env.add_member_overload("sub", "quantity_sub", q(), vec![q()], quantity_sub)?;
    env.add_member_overload("sign", "quantity_sign", q(), vec![], quantity_sign)?;
    env.add_member_overload("isInteger", "quantity_is_integer", q(), vec![], quantity_is_integer)?;
    env.add_member_overload("asInteger", "quantity_as_integer", q(), vec![], quantity_as_integer)?;
    env.add_macro(Macro::receiver("bind", 3, bind))?;
    Ok(())
}

/// `cel.bind(var, init, result)` (cel-go's `ext.Bindings`): `result` with `var` bound to
/// `init`, as a comprehension over no elements whose accumulator is `var`. A `bind` on any
/// other target is left alone.
fn bind(
    helper: &mut MacroExprHelper<'_>,
    target: &mut Option<IdedExpr>,
    args: &mut Vec<IdedExpr>,
) -> Result<Option<IdedExpr>, ParseError> {
    if !matches!(target.as_ref().map(|t| &t.expr), Some(Expr::Ident(name)) if name == "cel") {
        return Ok(None);
    }
    let var = match args.first().map(|a| &a.expr) {
        Some(Expr::Ident(name)) => name.clone(),
        _ => {
            let id = args.first().map_or(0, |a| a.id);
            return Err(helper.new_error(id, "cel.bind() variable names must be simple identifiers"));
        }
    };
    let (Some(result), Some(init)) = (args.pop(), args.pop()) else { return Ok(None) };
    let iter_range = helper.next_expr(Expr::List(ListExpr::new(Vec::new())));
    let loop_cond = helper.next_expr(Expr::Literal(LiteralValue::Boolean(false.into())));
    let loop_step = helper.next_expr(Expr::Ident(var.clone()));
    Ok(Some(helper.next_expr(Expr::Comprehension(Box::new(ComprehensionExpr {
        iter_range,
        iter_var: "#unused".to_owned(),
        iter_var2: None,
        accu_var: var,
        accu_init: init,
        loop_cond,
        loop_step,
        result,
    })))))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn gpu() -> Json {
        json!({
            "name": "gpu-0",
            "attributes": {
                "model": { "string": "MI300X" },
                "cu": { "int": 304 },
                "partitioned": { "bool": false },
                "driverVersion": { "version": "6.8.5" },
                "example.com/rack": { "string": "r7" },
            },
            "capacity": { "memory": { "value": "192Gi" } },
        })
    }

    fn eval(expression: &str) -> Result<bool, CelError> {
        Selectors::new().compile(expression)?.matches("gpu.example.io", &gpu())
    }

    #[test]
    fn names_without_a_domain_are_the_drivers_and_values_keep_their_types() {
        assert_eq!(eval(r#"device.driver == "gpu.example.io""#), Ok(true));
        assert_eq!(eval(r#"device.attributes["gpu.example.io"].model == "MI300X""#), Ok(true));
        assert_eq!(eval(r#"device.attributes["gpu.example.io"].cu > 300"#), Ok(true));
        assert_eq!(eval(r#"!device.attributes["gpu.example.io"].partitioned"#), Ok(true));
        assert_eq!(eval(r#"device.attributes["example.com"].rack == "r7""#), Ok(true));
        assert_eq!(eval("device.allowMultipleAllocations"), Ok(false));
    }

    #[test]
    fn an_unknown_domain_is_empty_but_an_unknown_name_is_an_error() {
        assert_eq!(eval(r#""model" in device.attributes["other.io"]"#), Ok(false));
        assert_eq!(eval(r#""model" in device.attributes["gpu.example.io"]"#), Ok(true));
        assert!(matches!(eval(r#"device.attributes["other.io"].model == "x""#), Err(CelError::Runtime(_))));
        assert!(matches!(eval(r#"device.attributes["gpu.example.io"].nope == 1"#), Err(CelError::Runtime(_))));
    }

    /// Issue 60 (5): a misspelt domain failed as `No such key: model`, naming the attribute that
    /// exists; the error now names the domain first, and the device's domains.
    #[test]
    fn a_lookup_in_an_unknown_domain_names_the_domain() {
        let Err(CelError::Runtime(e)) = eval(r#"device.attributes["gpu.exmaple.io"].model == "x""#) else {
            panic!("a runtime error")
        };
        assert!(e.starts_with(r#"unknown domain "gpu.exmaple.io""#), "{e}");
        assert!(e.contains(r#"its domains: "example.com", "gpu.example.io""#), "{e}");
        // A missing name in a domain the device has is only the missing name.
        let Err(CelError::Runtime(e)) = eval(r#"device.attributes["gpu.example.io"].nope == 1"#) else {
            panic!("a runtime error")
        };
        assert!(!e.contains("unknown domain"), "{e}");
    }

    #[test]
    fn semver_and_quantity_compare_as_kubernetes_libraries_do() {
        let a = r#"device.attributes["gpu.example.io"].driverVersion"#;
        assert_eq!(eval(&format!(r#"{a}.isGreaterThan(semver("6.8.0"))"#)), Ok(true));
        assert_eq!(eval(&format!(r#"{a}.isLessThan(semver("6.10.0"))"#)), Ok(true));
        assert_eq!(eval(&format!(r#"{a}.compareTo(semver("6.8.5")) == 0 && {a}.major() == 6"#)), Ok(true));
        assert_eq!(eval(&format!(r#"{a} == semver("6.8.5")"#)), Ok(true));
        let m = r#"device.capacity["gpu.example.io"].memory"#;
        assert_eq!(eval(&format!(r#"{m}.isGreaterThan(quantity("100Gi"))"#)), Ok(true));
        assert_eq!(eval(&format!(r#"{m}.compareTo(quantity("192Gi")) == 0"#)), Ok(true));
        // 192Gi is 206158430208 bytes: across suffixes, by value.
        assert_eq!(
            eval(&format!(r#"{m}.isLessThan(quantity("207G")) && {m}.isGreaterThan(quantity("206G"))"#)),
            Ok(true)
        );
        assert_eq!(
            eval(r#"isQuantity("1Gi") && !isQuantity("1 Gi") && isSemver("1.0.0") && !isSemver("1.0")"#),
            Ok(true)
        );
        assert!(matches!(eval(r#"semver("01.0.0").major() == 1"#), Err(CelError::Runtime(_))), "leading zero");
    }

    #[test]
    fn bind_names_a_subexpression_and_a_non_bool_result_is_an_error() {
        assert_eq!(
            eval(r#"cel.bind(g, device.attributes["gpu.example.io"], g.cu == 304 && g.model.startsWith("MI3"))"#),
            Ok(true)
        );
        assert!(matches!(eval(r#"device.attributes["gpu.example.io"].cu"#), Err(CelError::Runtime(_))));
        assert!(matches!(eval("device.driver =="), Err(CelError::Compile(_))));
        assert!(matches!(Selectors::new().compile(&"a".repeat(MAX_EXPRESSION_BYTES + 1)), Err(CelError::Compile(_))));
    }
}
