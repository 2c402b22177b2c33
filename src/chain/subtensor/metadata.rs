//! Subtensor's runtime metadata (V15), decoded, and the check that what iota encodes is there.
//!
//! The metadata is the runtime's own description of its pallets, calls, storage, runtime APIs,
//! types and transaction extensions. Every byte iota sends is encoded against it (see
//! [`super::calls`] and [`super::extrinsic`]), so a call's pallet and call index, its
//! arguments' types and the extensions a transaction carries all come from here, not from
//! constants in this crate. [`Metadata::check_iota_uses`] says, before anything is signed,
//! whether a runtime still has every item iota relies on with the argument shapes iota encodes:
//! after a runtime upgrade that changed one, the answer is one line naming it.

use frame_metadata::v15::{
    RuntimeMetadataV15, StorageEntryModifier, StorageEntryType, StorageHasher,
};
use frame_metadata::{META_RESERVED, RuntimeMetadata, RuntimeMetadataPrefixed};
use parity_scale_codec::Decode;
use scale_info::form::PortableForm;
use scale_info::{PortableRegistry, TypeDef, TypeDefPrimitive};
use scale_value::{Composite, Primitive, ValueDef};

use super::SubtensorError;

/// The pallet that holds subnets, registrations and weights.
pub const SUBTENSOR_PALLET: &str = "SubtensorModule";

/// The shape of an argument, as iota encodes it (newtype wrappers such as `NetUid` are seen
/// through: a `NetUid` is a [`Shape::U16`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// `u16`.
    U16,
    /// `u64`.
    U64,
    /// 32 bytes (`AccountId32`, `H256`, `[u8; 32]`).
    Bytes32,
    /// `Vec<u16>`.
    VecU16,
    /// `Vec<(u16, u16)>` (a neuron's stored weights: uid and value).
    VecU16Pairs,
    /// `Vec<(32 bytes, u64, ...)>`: a hotkey's weight commits (hash, commit block, then more
    /// u64 block numbers).
    VecCommits,
}

/// A call iota encodes: its pallet, name and arguments in order.
#[derive(Debug, Clone, Copy)]
pub struct CallSpec {
    /// The pallet's name in the metadata.
    pub pallet: &'static str,
    /// The call's name.
    pub call: &'static str,
    /// Argument names and shapes, in the call's order.
    pub args: &'static [(&'static str, Shape)],
}

/// A runtime API method iota calls: its API, name and inputs in order.
#[derive(Debug, Clone, Copy)]
pub struct RuntimeApiSpec {
    /// The runtime API's name.
    pub api: &'static str,
    /// The method's name.
    pub method: &'static str,
    /// Input names and shapes, in order.
    pub inputs: &'static [(&'static str, Shape)],
}

/// `SubtensorModule.burned_register(netuid, hotkey)`: register a hotkey by burning TAO.
pub const BURNED_REGISTER: CallSpec = CallSpec {
    pallet: SUBTENSOR_PALLET,
    call: "burned_register",
    args: &[("netuid", Shape::U16), ("hotkey", Shape::Bytes32)],
};

/// `SubtensorModule.set_weights(netuid, dests, weights, version_key)`.
pub const SET_WEIGHTS: CallSpec = CallSpec {
    pallet: SUBTENSOR_PALLET,
    call: "set_weights",
    args: &[
        ("netuid", Shape::U16),
        ("dests", Shape::VecU16),
        ("weights", Shape::VecU16),
        ("version_key", Shape::U64),
    ],
};

/// `SubtensorModule.commit_weights(netuid, commit_hash)`: commit-reveal v2, the commit.
pub const COMMIT_WEIGHTS: CallSpec = CallSpec {
    pallet: SUBTENSOR_PALLET,
    call: "commit_weights",
    args: &[("netuid", Shape::U16), ("commit_hash", Shape::Bytes32)],
};

/// `SubtensorModule.reveal_weights(netuid, uids, values, salt, version_key)`: the reveal.
pub const REVEAL_WEIGHTS: CallSpec = CallSpec {
    pallet: SUBTENSOR_PALLET,
    call: "reveal_weights",
    args: &[
        ("netuid", Shape::U16),
        ("uids", Shape::VecU16),
        ("values", Shape::VecU16),
        ("salt", Shape::VecU16),
        ("version_key", Shape::U64),
    ],
};

/// Every call iota encodes.
pub const IOTA_CALLS: &[CallSpec] = &[BURNED_REGISTER, SET_WEIGHTS, COMMIT_WEIGHTS, REVEAL_WEIGHTS];

/// The `SubtensorModule` storage items iota reads or may read (subnets, registrations, burn,
/// permits, commit-reveal settings, rate limit and pending commits); the chain client decodes
/// them with the types the metadata gives.
pub const IOTA_STORAGE: &[&str] = &[
    "NetworksAdded",
    "Uids",
    "Keys",
    "Burn",
    "Tempo",
    "ValidatorPermit",
    "CommitRevealWeightsEnabled",
    "RevealPeriodEpochs",
    "WeightsSetRateLimit",
    "WeightsVersionKey",
    "LastUpdate",
    "WeightCommits",
];

/// A storage item iota decodes field by field: its key and value shapes, checked beyond the
/// item's existence.
#[derive(Debug, Clone, Copy)]
pub struct StorageSpec {
    /// The pallet's name in the metadata.
    pub pallet: &'static str,
    /// The item's name.
    pub entry: &'static str,
    /// The shapes of its keys, in order.
    pub keys: &'static [Shape],
    /// The shape of its value.
    pub value: Shape,
}

/// `SubtensorModule.Weights(netuid, uid)`: the weights uid last set on the subnet (its first
/// key is the netuid of the subnet's main mechanism: `NetUidStorageIndex`, a u16).
pub const WEIGHTS: StorageSpec = StorageSpec {
    pallet: SUBTENSOR_PALLET,
    entry: "Weights",
    keys: &[Shape::U16, Shape::U16],
    value: Shape::VecU16Pairs,
};

/// `SubtensorModule.WeightCommits(netuid, hotkey)`: a hotkey's pending v2 commits (hash,
/// commit block, first and last reveal block in spec 461).
pub const WEIGHT_COMMITS: StorageSpec = StorageSpec {
    pallet: SUBTENSOR_PALLET,
    entry: "WeightCommits",
    keys: &[Shape::U16, Shape::Bytes32],
    value: Shape::VecCommits,
};

/// The storage items iota decodes with the shapes given.
pub const IOTA_TYPED_STORAGE: &[StorageSpec] = &[WEIGHTS, WEIGHT_COMMITS];

/// The runtime API methods iota's chain client is to call for the metagraph.
pub const IOTA_RUNTIME_APIS: &[RuntimeApiSpec] = &[
    RuntimeApiSpec {
        api: "SubnetInfoRuntimeApi",
        method: "get_metagraph",
        inputs: &[("netuid", Shape::U16)],
    },
    RuntimeApiSpec {
        api: "SubnetInfoRuntimeApi",
        method: "get_selective_metagraph",
        inputs: &[("netuid", Shape::U16), ("metagraph_indexes", Shape::VecU16)],
    },
];

/// The runtime's name and versions, read from the `System.Version` constant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimeVersion {
    /// `spec_name` (subtensor's is `node-subtensor`).
    pub spec_name: String,
    /// `spec_version`: goes into every signed payload.
    pub spec_version: u32,
    /// `transaction_version`: goes into every signed payload.
    pub transaction_version: u32,
}

/// A transaction extension the runtime requires, in the metadata's order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransactionExtension {
    /// Its identifier (`CheckNonce`, `CheckMortality`, ...).
    pub identifier: String,
    /// The type of what it adds to the extrinsic.
    pub extra_ty: u32,
    /// The type of what it adds only to the signed payload.
    pub additional_ty: u32,
}

/// Decoded V15 runtime metadata.
#[derive(Debug, Clone)]
pub struct Metadata {
    v15: RuntimeMetadataV15,
}

impl Metadata {
    /// Decodes metadata as the runtime serves it (`meta` magic, then version 15), or wrapped in
    /// the `Option<OpaqueMetadata>` that `Metadata_metadata_at_version` returns.
    ///
    /// # Errors
    /// [`SubtensorError::Metadata`] when the bytes are not V15 metadata.
    pub fn decode(bytes: &[u8]) -> Result<Metadata, SubtensorError> {
        let unreadable = |reason: String| SubtensorError::Metadata { reason };
        let magic = META_RESERVED.to_le_bytes();
        let prefixed: &[u8];
        let unwrapped: Vec<u8>;
        if bytes.starts_with(&magic) {
            prefixed = bytes;
        } else {
            let opaque = Option::<Vec<u8>>::decode(&mut &bytes[..]).map_err(|e| {
                unreadable(format!(
                    "neither `meta`-prefixed nor an Option<OpaqueMetadata>: {e}"
                ))
            })?;
            unwrapped = opaque.ok_or_else(|| {
                unreadable("the runtime returned no metadata at this version".into())
            })?;
            prefixed = &unwrapped;
        }
        let mut input = prefixed;
        let decoded = RuntimeMetadataPrefixed::decode(&mut input)
            .map_err(|e| unreadable(format!("SCALE decoding failed: {e}")))?;
        if !input.is_empty() {
            return Err(unreadable(format!(
                "{} bytes left over after the metadata",
                input.len()
            )));
        }
        if decoded.0 != META_RESERVED {
            return Err(unreadable("no `meta` magic".into()));
        }
        match decoded.1 {
            RuntimeMetadata::V15(v15) => Ok(Metadata { v15 }),
            other => Err(unreadable(format!(
                "metadata version {} (iota reads version 15)",
                other.version()
            ))),
        }
    }

    /// The type registry every type id here refers to.
    pub fn types(&self) -> &PortableRegistry {
        &self.v15.types
    }

    /// The type of the runtime's outer call enum (`RuntimeCall`).
    pub fn call_type(&self) -> u32 {
        self.v15.outer_enums.call_enum_ty.id
    }

    /// The extrinsic format version (4 for subtensor at the recorded runtime).
    pub fn extrinsic_version(&self) -> u8 {
        self.v15.extrinsic.version
    }

    /// The type of a signed extrinsic's sender (`MultiAddress`).
    pub fn address_type(&self) -> u32 {
        self.v15.extrinsic.address_ty.id
    }

    /// The type of a signed extrinsic's signature (`MultiSignature`).
    pub fn signature_type(&self) -> u32 {
        self.v15.extrinsic.signature_ty.id
    }

    /// The transaction extensions every signed extrinsic carries, in order.
    pub fn transaction_extensions(&self) -> Vec<TransactionExtension> {
        self.v15
            .extrinsic
            .signed_extensions
            .iter()
            .map(|e| TransactionExtension {
                identifier: e.identifier.clone(),
                extra_ty: e.ty.id,
                additional_ty: e.additional_signed.id,
            })
            .collect()
    }

    /// The runtime's name and versions, decoded from the `System.Version` constant with the
    /// constant's own type.
    ///
    /// # Errors
    /// [`SubtensorError`] when the constant is missing or does not decode.
    pub fn runtime_version(&self) -> Result<RuntimeVersion, SubtensorError> {
        let constant = self
            .v15
            .pallets
            .iter()
            .find(|p| p.name == "System")
            .and_then(|p| p.constants.iter().find(|c| c.name == "Version"))
            .ok_or_else(|| SubtensorError::Missing {
                what: "constant",
                name: "System.Version".into(),
            })?;
        let value = scale_value::scale::decode_as_type(
            &mut &constant.value[..],
            constant.ty.id,
            self.types(),
        )
        .map_err(|e| SubtensorError::Metadata {
            reason: format!("System.Version does not decode: {e}"),
        })?;
        let ValueDef::Composite(Composite::Named(fields)) = value.value else {
            return Err(SubtensorError::Metadata {
                reason: "System.Version is not a struct".into(),
            });
        };
        let field = |name: &str| {
            fields
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, v)| unwrap_newtypes(&v.value))
                .ok_or_else(|| SubtensorError::Metadata {
                    reason: format!("System.Version has no `{name}`"),
                })
        };
        let number = |name: &str| -> Result<u32, SubtensorError> {
            match field(name)? {
                ValueDef::Primitive(Primitive::U128(n)) => {
                    u32::try_from(*n).map_err(|_| SubtensorError::Metadata {
                        reason: format!("System.Version `{name}` is out of range"),
                    })
                }
                _ => Err(SubtensorError::Metadata {
                    reason: format!("System.Version `{name}` is not a number"),
                }),
            }
        };
        let spec_name = match field("spec_name")? {
            ValueDef::Primitive(Primitive::String(s)) => s.clone(),
            _ => {
                return Err(SubtensorError::Metadata {
                    reason: "System.Version `spec_name` is not a string".into(),
                });
            }
        };
        Ok(RuntimeVersion {
            spec_name,
            spec_version: number("spec_version")?,
            transaction_version: number("transaction_version")?,
        })
    }

    /// A call's pallet index, call index and arguments (name and type id), in order.
    ///
    /// # Errors
    /// [`SubtensorError::Missing`] when the runtime has no such pallet or call.
    pub fn call(&self, pallet: &str, call: &str) -> Result<CallInfo, SubtensorError> {
        let missing = || SubtensorError::Missing {
            what: "call",
            name: format!("{pallet}.{call}"),
        };
        let found = self
            .v15
            .pallets
            .iter()
            .find(|p| p.name == pallet)
            .ok_or_else(missing)?;
        let calls_ty = found.calls.as_ref().ok_or_else(missing)?.ty.id;
        let TypeDef::Variant(variants) =
            &self.types().resolve(calls_ty).ok_or_else(missing)?.type_def
        else {
            return Err(missing());
        };
        let variant = variants
            .variants
            .iter()
            .find(|v| v.name == call)
            .ok_or_else(missing)?;
        Ok(CallInfo {
            pallet_index: found.index,
            call_index: variant.index,
            args: variant
                .fields
                .iter()
                .map(|f| (f.name.clone().unwrap_or_default(), f.ty.id))
                .collect(),
        })
    }

    /// Checks that `spec`'s call exists with exactly its arguments, in order and shape.
    ///
    /// # Errors
    /// [`SubtensorError::Missing`] or [`SubtensorError::Changed`].
    pub fn check_call(&self, spec: &CallSpec) -> Result<CallInfo, SubtensorError> {
        let info = self.call(spec.pallet, spec.call)?;
        self.check_fields(
            &format!("{}.{}", spec.pallet, spec.call),
            spec.args,
            &info.args,
        )?;
        Ok(info)
    }

    /// Checks that the runtime API method exists with exactly `spec`'s inputs.
    ///
    /// # Errors
    /// [`SubtensorError::Missing`] or [`SubtensorError::Changed`].
    pub fn check_runtime_api(&self, spec: &RuntimeApiSpec) -> Result<(), SubtensorError> {
        let name = format!("{}.{}", spec.api, spec.method);
        let method = self
            .v15
            .apis
            .iter()
            .find(|a| a.name == spec.api)
            .and_then(|a| a.methods.iter().find(|m| m.name == spec.method))
            .ok_or_else(|| SubtensorError::Missing {
                what: "runtime API method",
                name: name.clone(),
            })?;
        let inputs: Vec<(String, u32)> = method
            .inputs
            .iter()
            .map(|i| (i.name.clone(), i.ty.id))
            .collect();
        self.check_fields(&name, spec.inputs, &inputs)
    }

    /// Checks that `pallet` has the storage item `entry`.
    ///
    /// # Errors
    /// [`SubtensorError::Missing`].
    pub fn check_storage(&self, pallet: &str, entry: &str) -> Result<(), SubtensorError> {
        let present = self
            .v15
            .pallets
            .iter()
            .find(|p| p.name == pallet)
            .and_then(|p| p.storage.as_ref())
            .is_some_and(|s| s.entries.iter().any(|e| e.name == entry));
        if present {
            Ok(())
        } else {
            Err(SubtensorError::Missing {
                what: "storage item",
                name: format!("{pallet}.{entry}"),
            })
        }
    }

    /// Checks every call ([`IOTA_CALLS`]), storage item ([`IOTA_STORAGE`]) and runtime API
    /// method ([`IOTA_RUNTIME_APIS`]) iota uses; the first one missing or changed is the error.
    ///
    /// # Errors
    /// [`SubtensorError::Missing`] or [`SubtensorError::Changed`].
    pub fn check_iota_uses(&self) -> Result<(), SubtensorError> {
        for spec in IOTA_CALLS {
            self.check_call(spec)?;
        }
        for entry in IOTA_STORAGE {
            self.check_storage(SUBTENSOR_PALLET, entry)?;
        }
        for spec in IOTA_TYPED_STORAGE {
            self.check_storage_shape(spec)?;
        }
        for spec in IOTA_RUNTIME_APIS {
            self.check_runtime_api(spec)?;
        }
        Ok(())
    }

    /// Checks that `spec`'s storage item exists with its key and value shapes.
    ///
    /// # Errors
    /// [`SubtensorError::Missing`] or [`SubtensorError::Changed`].
    pub fn check_storage_shape(&self, spec: &StorageSpec) -> Result<(), SubtensorError> {
        let info = self.storage_entry(spec.pallet, spec.entry)?;
        let keys: Vec<Option<Shape>> = info.key_tys.iter().map(|t| self.shape_of(*t)).collect();
        let value = self.shape_of(info.value_ty);
        let expected: Vec<Option<Shape>> = spec.keys.iter().copied().map(Some).collect();
        if keys == expected && value == Some(spec.value) {
            return Ok(());
        }
        let describe = |shape: Option<Shape>, ty: u32| match shape {
            Some(s) => format!("{s:?}"),
            None => self.type_name(ty),
        };
        let found_keys: Vec<String> = keys
            .iter()
            .zip(&info.key_tys)
            .map(|(s, t)| describe(*s, *t))
            .collect();
        Err(SubtensorError::Changed {
            name: format!("{}.{}", spec.pallet, spec.entry),
            expected: format!("keys {:?} -> {:?}", spec.keys, spec.value),
            found: format!(
                "keys [{}] -> {}",
                found_keys.join(", "),
                describe(value, info.value_ty)
            ),
        })
    }

    /// A storage item's prefix, hashers, key and value types and default, as the metadata
    /// declares them.
    ///
    /// # Errors
    /// [`SubtensorError::Missing`] when the pallet has no such item.
    pub fn storage_entry(&self, pallet: &str, entry: &str) -> Result<StorageInfo, SubtensorError> {
        let missing = || SubtensorError::Missing {
            what: "storage item",
            name: format!("{pallet}.{entry}"),
        };
        let storage = self
            .v15
            .pallets
            .iter()
            .find(|p| p.name == pallet)
            .and_then(|p| p.storage.as_ref())
            .ok_or_else(missing)?;
        let found = storage
            .entries
            .iter()
            .find(|e| e.name == entry)
            .ok_or_else(missing)?;
        let (hashers, key_tys, value_ty) = match &found.ty {
            StorageEntryType::Plain(ty) => (Vec::new(), Vec::new(), ty.id),
            StorageEntryType::Map {
                hashers,
                key,
                value,
            } => {
                // Several hashers: the key type is a tuple with one element per hasher.
                let key_tys = match (
                    &self.types().resolve(key.id).map(|t| &t.type_def),
                    hashers.len(),
                ) {
                    (_, 1) => vec![key.id],
                    (Some(TypeDef::Tuple(tuple)), n) if tuple.fields.len() == n => {
                        tuple.fields.iter().map(|f| f.id).collect()
                    }
                    _ => {
                        return Err(SubtensorError::Metadata {
                            reason: format!(
                                "{pallet}.{entry} has {} hashers but its key is not a tuple of as many",
                                hashers.len()
                            ),
                        });
                    }
                };
                (hashers.clone(), key_tys, value.id)
            }
        };
        Ok(StorageInfo {
            prefix: storage.prefix.clone(),
            name: found.name.clone(),
            hashers,
            key_tys,
            value_ty,
            default: found.default.clone(),
            optional: matches!(found.modifier, StorageEntryModifier::Optional),
        })
    }

    /// The output type of runtime API method `api.method`.
    ///
    /// # Errors
    /// [`SubtensorError::Missing`] when the runtime has no such method.
    pub fn runtime_api_output(&self, api: &str, method: &str) -> Result<u32, SubtensorError> {
        self.v15
            .apis
            .iter()
            .find(|a| a.name == api)
            .and_then(|a| a.methods.iter().find(|m| m.name == method))
            .map(|m| m.output.id)
            .ok_or_else(|| SubtensorError::Missing {
                what: "runtime API method",
                name: format!("{api}.{method}"),
            })
    }

    /// The pallet of index `pallet_index`, the name of its error variant `error_index` (what a
    /// `DispatchError::Module` names) and the first line of its documentation, if the metadata
    /// has them.
    pub fn module_error(
        &self,
        pallet_index: u8,
        error_index: u8,
    ) -> Option<(String, String, String)> {
        let pallet = self.v15.pallets.iter().find(|p| p.index == pallet_index)?;
        let ty = pallet.error.as_ref()?.ty.id;
        let TypeDef::Variant(variants) = &self.types().resolve(ty)?.type_def else {
            return None;
        };
        let variant = variants.variants.iter().find(|v| v.index == error_index)?;
        let doc = variant
            .docs
            .iter()
            .map(|d| d.trim())
            .find(|d| !d.is_empty())
            .unwrap_or_default()
            .to_owned();
        Some((pallet.name.clone(), variant.name.clone(), doc))
    }

    /// The shape of type `ty`, seeing through single-field wrappers; `None` for anything iota
    /// does not encode.
    pub fn shape_of(&self, ty: u32) -> Option<Shape> {
        let resolved = self.types().resolve(ty)?;
        match &resolved.type_def {
            TypeDef::Composite(c) if c.fields.len() == 1 => self.shape_of(c.fields[0].ty.id),
            TypeDef::Primitive(TypeDefPrimitive::U16) => Some(Shape::U16),
            TypeDef::Primitive(TypeDefPrimitive::U64) => Some(Shape::U64),
            TypeDef::Array(a) if a.len == 32 && self.is_u8(a.type_param.id) => Some(Shape::Bytes32),
            TypeDef::Sequence(s) if self.shape_of(s.type_param.id) == Some(Shape::U16) => {
                Some(Shape::VecU16)
            }
            TypeDef::Sequence(s) if self.is_u16_pair(s.type_param.id) => Some(Shape::VecU16Pairs),
            TypeDef::Sequence(s) if self.is_commit(s.type_param.id) => Some(Shape::VecCommits),
            _ => None,
        }
    }

    fn is_u16_pair(&self, ty: u32) -> bool {
        self.types().resolve(ty).is_some_and(|t| match &t.type_def {
            TypeDef::Tuple(pair) => {
                pair.fields.len() == 2
                    && pair
                        .fields
                        .iter()
                        .all(|f| self.shape_of(f.id) == Some(Shape::U16))
            }
            _ => false,
        })
    }

    /// A tuple of 32 bytes, then at least one u64.
    fn is_commit(&self, ty: u32) -> bool {
        self.types().resolve(ty).is_some_and(|t| match &t.type_def {
            TypeDef::Tuple(fields) => match fields.fields.split_first() {
                Some((hash, blocks)) => {
                    self.shape_of(hash.id) == Some(Shape::Bytes32)
                        && !blocks.is_empty()
                        && blocks
                            .iter()
                            .all(|b| self.shape_of(b.id) == Some(Shape::U64))
                }
                None => false,
            },
            _ => false,
        })
    }

    fn is_u8(&self, ty: u32) -> bool {
        self.types()
            .resolve(ty)
            .is_some_and(|t| matches!(t.type_def, TypeDef::Primitive(TypeDefPrimitive::U8)))
    }

    fn check_fields(
        &self,
        name: &str,
        expected: &[(&str, Shape)],
        found: &[(String, u32)],
    ) -> Result<(), SubtensorError> {
        let same = expected.len() == found.len()
            && expected
                .iter()
                .zip(found)
                .all(|((n, shape), (fname, ty))| n == fname && self.shape_of(*ty) == Some(*shape));
        if same {
            return Ok(());
        }
        let describe_expected = expected
            .iter()
            .map(|(n, s)| format!("{n}: {s:?}"))
            .collect::<Vec<_>>()
            .join(", ");
        let describe_found = found
            .iter()
            .map(|(n, ty)| match self.shape_of(*ty) {
                Some(s) => format!("{n}: {s:?}"),
                None => format!("{n}: {}", self.type_name(*ty)),
            })
            .collect::<Vec<_>>()
            .join(", ");
        Err(SubtensorError::Changed {
            name: name.to_owned(),
            expected: format!("({describe_expected})"),
            found: format!("({describe_found})"),
        })
    }

    fn type_name(&self, ty: u32) -> String {
        self.types()
            .resolve(ty)
            .map(|t: &scale_info::Type<PortableForm>| t.path.segments.join("::"))
            .filter(|p| !p.is_empty())
            .unwrap_or_else(|| format!("type #{ty}"))
    }
}

/// The value inside single-field wrappers (`Cow<str>` around a string, say).
fn unwrap_newtypes<T>(value: &ValueDef<T>) -> &ValueDef<T> {
    match value {
        ValueDef::Composite(Composite::Unnamed(inner)) if inner.len() == 1 => {
            unwrap_newtypes(&inner[0].value)
        }
        ValueDef::Composite(Composite::Named(inner)) if inner.len() == 1 => {
            unwrap_newtypes(&inner[0].1.value)
        }
        other => other,
    }
}

/// A storage item as the metadata declares it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StorageInfo {
    /// The pallet's storage prefix (its name, for subtensor's pallets).
    pub prefix: String,
    /// The item's name.
    pub name: String,
    /// One hasher per key, in order (none for a plain value).
    pub hashers: Vec<StorageHasher>,
    /// The keys' types, in order.
    pub key_tys: Vec<u32>,
    /// The value's type.
    pub value_ty: u32,
    /// The value an absent key reads as (for a `Default` item).
    pub default: Vec<u8>,
    /// Whether an absent key reads as nothing (`Optional`) rather than the default.
    pub optional: bool,
}

/// Where a call sits in the runtime and what it takes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallInfo {
    /// The pallet's index (the call data's first byte).
    pub pallet_index: u8,
    /// The call's index in its pallet (the second byte).
    pub call_index: u8,
    /// Argument names and type ids, in order.
    pub args: Vec<(String, u32)>,
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::chain::subtensor::recorded_metadata as recorded;

    #[test]
    fn recorded_metadata_is_subtensor_461_and_has_what_iota_uses() {
        let md = recorded();
        let version = md.runtime_version().unwrap();
        assert_eq!(version.spec_name, "node-subtensor");
        assert_eq!(version.spec_version, 461);
        assert_eq!(version.transaction_version, 1);
        md.check_iota_uses().unwrap();
        assert_eq!(md.extrinsic_version(), 4);
    }

    #[test]
    fn a_changed_or_missing_item_is_named() {
        let md = recorded();
        const CHANGED: CallSpec = CallSpec {
            pallet: SUBTENSOR_PALLET,
            call: "set_weights",
            args: &[("netuid", Shape::U16), ("dests", Shape::VecU16)],
        };
        let err = md.check_call(&CHANGED).unwrap_err().to_string();
        assert!(
            err.contains("changed `SubtensorModule.set_weights`"),
            "{err}"
        );
        assert!(err.contains("version_key: U64"), "{err}");
        let err = md.call(SUBTENSOR_PALLET, "no_such_call").unwrap_err();
        assert!(
            err.to_string()
                .contains("no call `SubtensorModule.no_such_call`")
        );
        assert!(md.check_storage(SUBTENSOR_PALLET, "NoSuchItem").is_err());
        // A storage item of other shapes: `Weights` read as if its value were a Vec<u16>.
        const WEIGHTS_AS_VEC: StorageSpec = StorageSpec {
            value: Shape::VecU16,
            ..WEIGHTS
        };
        let err = md
            .check_storage_shape(&WEIGHTS_AS_VEC)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("changed `SubtensorModule.Weights`")
                && err.contains("keys [U16, U16] -> VecU16Pairs"),
            "{err}"
        );
    }

    #[test]
    fn the_recorded_weights_item_is_keyed_by_netuid_and_uid_and_holds_u16_pairs() {
        let md = recorded();
        md.check_storage_shape(&WEIGHTS).unwrap();
        md.check_storage_shape(&WEIGHT_COMMITS).unwrap();
        let info = md.storage_entry(SUBTENSOR_PALLET, "Weights").unwrap();
        assert_eq!(info.key_tys.len(), 2);
        assert_eq!(md.shape_of(info.value_ty), Some(Shape::VecU16Pairs));
    }

    #[test]
    fn garbage_is_refused() {
        assert!(Metadata::decode(b"").is_err());
        assert!(Metadata::decode(b"meta\x0f\x00").is_err());
        assert!(Metadata::decode(&[0u8; 16]).is_err());
    }
}
